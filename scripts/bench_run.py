"""python scripts/bench_run.py [train.py options] [--compare FIELD=A,B] [--seeds 1,2,3] [--nanogpt DIR] [--repeat N]
[--busy N]: whole training commands timed from the command to the prompt, with the loss of the model each run hands
over and where its time went. Variants run in turn, each in its own folder; --nanogpt times nanoGPT's CPU recipe on the
same text between them; --busy N runs N CPU-bound processes beside every run."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import parse_compare  # noqa: E402
from errors import (ArgumentParser, Interrupted, UserError, check_output_file,  # noqa: E402
                    run_cli)
from train_command import run_train  # noqa: E402
from common.run_folder import SUMMARY, RunDir, read_summary, write_text_atomic  # noqa: E402

# nanoGPT's README, "I only have a laptop": its Shakespeare config shrunk for a CPU
NANOGPT_CPU_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                      "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                      "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]


def variant_name(variant: dict[str, str]) -> str:
    return ",".join(f"{field}={value}" for field, value in variant.items()) or "as given"


def logged_run(log: Path, argv: list[str], **how) -> tuple[int, float]:
    """run_train(argv, **how), its output in log (a link under that name is refused): (exit code, seconds)."""
    started = time.perf_counter()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "w", encoding="utf-8") as out:
        code = run_train(argv, output=out, **how)
    return code, time.perf_counter() - started


def last_line(log: Path) -> str:
    return (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["(no output)"])[-1]


def stopped(exit_code: int) -> bool:
    """Whether a signal (Ctrl-C, SIGTERM, SIGHUP) ended a nanoGPT step: the user stopped the benchmark."""
    return exit_code in (130, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP)


def run_once(argv: list[str], folder: Path, cold_cache: bool) -> dict:
    """One `python train.py argv --out_dir folder --overwrite`, timed whole: its summary's figures. Output: folder.log."""
    env = dict(os.environ)
    if cold_cache:  # an empty compiler cache for this run alone
        cache = folder.with_name(folder.name + ".compile_cache")
        shutil.rmtree(cache, ignore_errors=True)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
    log = folder.with_name(folder.name + ".log")
    code, whole = logged_run(log, [*argv, "--out_dir", str(folder), "--overwrite"], env=env)
    if code == 130:
        raise Interrupted(f"stopped; the run in {folder} saved its last step (its output: {log})")
    if code != 0:
        raise UserError(f"{shlex.join(['python', 'train.py', *argv])}: {last_line(log).removeprefix('error: ')[:300]} "
                        f"(exit code {code}; its output: {log})")
    summary = read_summary(folder)
    if summary is None:
        raise UserError(f"{folder / SUMMARY} cannot be read after the run. See its output: {log}")
    seconds = summary.get("seconds", {})
    return {"whole_seconds": whole, "train_seconds": summary["train_seconds"],
            "first_step_seconds": summary.get("first_step_seconds"), "full_val_loss": summary.get("full_val_loss"),
            "model_step": summary["model_step"], "iterations": summary["iterations"],
            "stopped_early": summary["stopped_early"], "device": summary["device"], "phases": seconds, "log": str(log),
            "threads": summary.get("threads"), "expected_seconds": summary.get("expected_seconds")}


def threads_and_estimate(r: dict, before: str) -> str:
    """'2 threads, expected 15-18 s' after `before` for a run on a CPU; "" elsewhere."""
    parts = [f"{r['threads']} thread{'s' if r['threads'] != 1 else ''}"] if r.get("threads") else []
    if r.get("expected_seconds"):
        low, high = (f"{seconds:.0f}" for seconds in r["expected_seconds"])
        parts.append(f"expected {low} s" if low == high else f"expected {low}-{high} s")
    return before + ", ".join(parts) if parts else ""


@contextlib.contextmanager
def cpu_bound(count: int):
    """count processes that each keep a core busy while the block runs; ended after it, even on Ctrl-C."""
    hogs = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, start_new_session=True) for _ in range(count)]
    try:
        for hog in hogs:
            hog.stdout.readline()
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
            hog.stdout.close()


# ---- nanoGPT's CPU recipe, the yardstick ----------------------------------------------------------------------------
def corpus_file(rest: list[str]) -> Path:
    """The text file --data names: nanoGPT trains on the same one."""
    named = [rest[i + 1] for i, word in enumerate(rest[:-1]) if word == "--data"]
    named += [word.split("=", 1)[1] for word in rest if word.startswith("--data=")]
    if not named or not Path(named[-1]).is_file():
        raise UserError("--nanogpt trains nanoGPT on the same text, which is no file here. Name it with --data FILE")
    return Path(named[-1])


def prepare_nanogpt(checkout: Path, corpus: Path, work: Path) -> Path:
    """A copy of the checkout's code with corpus as its input.txt, prepared by its own prepare.py: the copy's folder.
    Nothing in the user's checkout is written."""
    if not (checkout / "train.py").is_file() or not (checkout / "data" / "shakespeare_char" / "prepare.py").is_file():
        raise UserError(f"--nanogpt {checkout}: not a checkout of karpathy/nanoGPT. Clone it and name its folder")
    code = work / "nanogpt-code"
    shutil.rmtree(code, ignore_errors=True)  # an earlier bench_run's copy
    data = code / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    for source in checkout.glob("*.py"):
        shutil.copyfile(source, code / source.name)
    shutil.copytree(checkout / "config", code / "config")
    shutil.copyfile(checkout / "data" / "shakespeare_char" / "prepare.py", data / "prepare.py")
    shutil.copyfile(corpus, data / "input.txt")
    log = work / "nanogpt-prepare.log"
    # prepare.py imports requests only to download, which it then does not: a stand-in where it is not installed
    stand_in = ("import importlib.util, runpy, sys, types\n"
                "if importlib.util.find_spec('requests') is None:\n"
                "    sys.modules['requests'] = types.ModuleType('requests')\n"
                "runpy.run_path('prepare.py', run_name='__main__')")
    exit_code, _ = logged_run(log, [], program=["-c", stand_in], cwd=data)
    if stopped(exit_code):
        raise Interrupted(f"stopped during nanoGPT's prepare.py (its output: {log})")
    if exit_code != 0:
        raise UserError(f"nanoGPT's prepare.py: {last_line(log)[:300]} (exit code {exit_code}; its output: {log})")
    return code


def run_nanogpt(code: Path, folder: Path, dtype: str) -> dict:
    """nanoGPT's CPU recipe in the copy, timed whole; its checkpoint scored as our full validation is, in dtype (our
    runs')."""
    import numpy as np
    from score_nanogpt import full_validation, load_nanogpt
    from common.machine import setup

    log = folder.with_name(folder.name + ".log")
    shutil.rmtree(folder, ignore_errors=True)
    exit_code, whole = logged_run(log, [*NANOGPT_CPU_RECIPE, f"--out_dir={folder}"], program=[str(code / "train.py")],
                                  cwd=code)
    if stopped(exit_code):
        raise Interrupted(f"stopped during nanoGPT's train.py (exit code {exit_code}; its output: {log})")
    if exit_code != 0:
        raise UserError(f"nanoGPT's train.py: {last_line(log)[:300]} (exit code {exit_code}; its output: {log})")
    rt = setup("cpu", dtype)
    model, facts = load_nanogpt(code, folder / "ckpt.pt", rt.device)
    val = np.fromfile(code / "data" / facts["dataset"] / "val.bin", dtype=np.uint16)
    loss = full_validation(model, val, facts["block_size"], 64, rt)
    return {"whole_seconds": whole, "full_val_loss": loss, "model_step": facts["step"], "log": str(log)}


def run_all(rest: list[str], variants: list[dict[str, str]], seeds: list[str], out: Path, repeat: int,
            cold_cache: bool, nanogpt: Path | None) -> tuple[dict, list[dict]]:
    """Every variant once per seed and round, nanoGPT's recipe first: ({variant: its runs}, nanoGPT's runs)."""
    runs, yardstick = {variant_name(v): [] for v in variants}, []
    import torch
    from configs import load_config
    dtype = load_config(rest, torch.cuda.is_available())[0].dtype
    for round_ in range(1, repeat + 1):
        for seed in seeds or [None]:
            where = f"-s{seed}-r{round_}" if seed is not None else f"-r{round_}"
            if nanogpt is not None:
                print(f"[round {round_}/{repeat}] nanoGPT's CPU recipe", file=sys.stderr, flush=True)
                r = run_nanogpt(nanogpt, out / f"nanogpt{where}", dtype)
                yardstick.append(r)
                print(f"  {r['whole_seconds']:.1f} s whole, full validation {r['full_val_loss']:.4f} "
                      f"(step {r['model_step']})", file=sys.stderr)
            for number, variant in enumerate(variants, start=1):
                name = variant_name(variant)
                extra = [part for field, value in variant.items() for part in (f"--{field}", value)]
                extra += ["--seed", seed] if seed is not None else []
                print(f"[round {round_}/{repeat}] {name}" + (f", seed {seed}" if seed is not None else ""),
                      file=sys.stderr, flush=True)
                r = run_once(rest + extra, out / f"{number:02d}{where}", cold_cache)
                r["seed"] = seed
                runs[name].append(r)
                loss = ("" if r["full_val_loss"] is None else
                        f", full validation {r['full_val_loss']:.4f} (step {r['model_step']})")
                print(f"  {r['whole_seconds']:.1f} s whole, {r['train_seconds']:.1f} s training{loss}"
                      f"{threads_and_estimate(r, ', ')}", file=sys.stderr)
    return runs, yardstick


def losses_of(done: list[dict]) -> list[float]:
    """The runs' full validation losses, where they have one."""
    return [r["full_val_loss"] for r in done if r["full_val_loss"] is not None]


def median_row(name: str, done: list[dict]) -> dict:
    """A variant's runs as one row of medians."""
    losses = losses_of(done)
    return {"variant": name, "whole_seconds": statistics.median(r["whole_seconds"] for r in done),
            "train_seconds": statistics.median(r["train_seconds"] for r in done),
            "full_val_loss": statistics.median(losses) if losses else None, "runs": done}


def spread_row(name: str, done: list[dict], yardstick: float | None) -> dict:
    """A variant's runs over the seeds: losses and times, their means and spread, the time against nanoGPT's."""
    losses = losses_of(done)
    wholes = [r["whole_seconds"] for r in done]
    row = {"variant": name, "losses": losses, "whole": wholes, "mean_whole_seconds": statistics.fmean(wholes),
           "mean_full_val_loss": statistics.fmean(losses) if losses else None,
           "loss_spread": max(losses) - min(losses) if losses else None}
    row["times_nanogpt"] = row["mean_whole_seconds"] / yardstick if yardstick else None
    return row


def print_seed_table(rows: list[dict], yardstick: list[dict]) -> None:
    print(f"\n{'variant':<32}{'mean full-val':>14}{'spread':>8}{'mean whole s':>13}{'x nanoGPT':>10}  each run "
          f"(full-val, whole s)")
    for row in rows:
        mean = f"{row['mean_full_val_loss']:.4f}" if row["mean_full_val_loss"] is not None else "-"
        spread = f"{row['loss_spread']:.4f}" if row["loss_spread"] is not None else "-"
        ratio = f"{row['times_nanogpt']:.2f}x" if row["times_nanogpt"] else "-"
        each = ", ".join(f"{loss:.4f} {whole:.1f}" for loss, whole in zip(row["losses"], row["whole"]))
        print(f"{row['variant']:<32}{mean:>14}{spread:>8}{row['mean_whole_seconds']:>13.1f}{ratio:>10}  {each}")
    if yardstick:
        wholes = [r["whole_seconds"] for r in yardstick]
        each = ", ".join(f"{r['full_val_loss']:.4f} {r['whole_seconds']:.1f}" for r in yardstick)
        print(f"{'nanoGPT CPU recipe':<32}{statistics.fmean(r['full_val_loss'] for r in yardstick):>14.4f}{'':>8}"
              f"{statistics.fmean(wholes):>13.1f}{'1.00x':>10}  {each}")


def main(argv: list[str] | None = None) -> int:
    # allow_abbrev off: train.py's --seed must not be read as --seeds
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip(), allow_abbrev=False)
    parser.add_argument("--out_dir", default="out/bench_run", help="a run folder (and .log) per variant and round")
    parser.add_argument("--compare", action="append", default=[], metavar="FIELD=A,B",
                        help="run under each value of a train.py field (repeat for more fields)")
    parser.add_argument("--seeds", default="", metavar="1,2,3", help="run every variant once per seed")
    parser.add_argument("--nanogpt", type=Path, default=None, metavar="DIR",
                        help="a checkout of karpathy/nanoGPT: time its CPU recipe on the same --data FILE too")
    parser.add_argument("--repeat", type=int, default=1, help="rounds: every variant once per round")
    parser.add_argument("--cold_compile_cache", action="store_true", help="an empty torch.compile cache for every run")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="N CPU-bound processes beside every run")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    args, rest = parser.parse_known_args(argv)
    if args.repeat < 1:
        raise UserError("--repeat must be at least 1")
    if not 0 <= args.busy <= 64:
        raise UserError(f"--busy {args.busy}: must be from 0 to 64")
    if any(word in ("--out_dir", "--resume", "--overwrite") for word in rest):
        raise UserError("bench_run.py chooses each run's folder. Leave --out_dir, --resume and --overwrite out")
    if args.seeds and ("--seed" in rest or any(word.startswith("--seed=") for word in rest)):
        raise UserError("--seeds chooses each run's seed. Leave --seed out")
    seeds = [seed.strip() for seed in args.seeds.split(",")] if args.seeds else []
    if not all(seed.isdigit() for seed in seeds):
        raise UserError(f"--seeds {args.seeds}: not whole numbers. Give e.g. --seeds 1,2,3")
    if args.json:
        check_output_file(args.json, "--json")
    corpus = corpus_file(rest) if args.nanogpt is not None else None
    variants = parse_compare(args.compare) if args.compare else [{}]
    # absolute: nanoGPT's train.py runs in its copy's folder
    out = Path(args.out_dir).absolute()
    owner = RunDir(out).claim(say=lambda message: None)  # one bench_run per folder
    try:
        nanogpt = prepare_nanogpt(args.nanogpt.resolve(), corpus, out) if args.nanogpt is not None else None
        with cpu_bound(args.busy):
            runs, yardstick = run_all(rest, variants, seeds, out, args.repeat, args.cold_compile_cache, nanogpt)
    finally:
        owner.release()
    rows = [median_row(name, done) for name, done in runs.items()]
    if args.busy:
        print(f"(every run beside {args.busy} CPU-bound process{'es' if args.busy > 1 else ''})")
    print(f"{'variant':<32}{'whole s':>9}{'train s':>9}{'full-val':>10}  where the time went")
    for row in rows:
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in row["runs"][-1]["phases"].items()
                           if phase != "total" and seconds >= 0.05)
        loss = f"{row['full_val_loss']:.4f}" if row["full_val_loss"] is not None else "-"
        print(f"{row['variant']:<32}{row['whole_seconds']:>9.1f}{row['train_seconds']:>9.1f}{loss:>10}  {phases}"
              f"{threads_and_estimate(row['runs'][-1], '; ')}")
    if any(len(row["runs"]) > 1 for row in rows):
        print("(whole s, train s and full-val: the medians of each variant's runs; where the time went: its last run)")
    figures = {"train_options": rest, "repeat": args.repeat, "cold_compile_cache": args.cold_compile_cache,
               "busy": args.busy, "variants": rows}
    if seeds or yardstick:
        per_nanogpt = statistics.fmean(r["whole_seconds"] for r in yardstick) if yardstick else None
        summary = [spread_row(name, done, per_nanogpt) for name, done in runs.items()]
        print_seed_table(summary, yardstick)
        figures.update(seeds=seeds, over_seeds=summary, nanogpt=yardstick)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(figures, indent=1) + "\n", "the figures file", "--json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
