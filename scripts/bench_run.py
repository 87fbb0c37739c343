"""python scripts/bench_run.py [train.py options]: whole train.py commands timed from outside, with their loss and
where their time went."""
from __future__ import annotations

import contextlib
import functools
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

import torch  # noqa: E402

from bench import options, parse_compare, variant_name  # noqa: E402
from bench_prepare import count, figures_parser, print_table, write_figures  # noqa: E402
from configs import load_config  # noqa: E402
from errors import Interrupted, UserError, run_cli  # noqa: E402
from train_command import run_train  # noqa: E402
from common.run_folder import SUMMARY, RunDir, read_summary  # noqa: E402

# nanoGPT's README, "I only have a laptop": its Shakespeare config shrunk for a CPU
NANOGPT_CPU_RECIPE = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
                      "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
                      "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]


def logged_run(log: Path, argv: list[str], what: str, **how) -> float:
    """run_train(argv, **how) with its output in log (never through a link): its seconds."""
    started = time.perf_counter()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "w", encoding="utf-8") as out:
        code = run_train(argv, output=out, **how)
    if code in (130, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP):
        raise Interrupted(f"stopped during {what} (exit code {code}; its output: {log})")
    if code != 0:
        said = (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{what}: {said.removeprefix('error: ')[:300]} (exit code {code}; its output: {log})")
    return time.perf_counter() - started


def run_once(argv: list[str], folder: Path, cold_cache: bool) -> dict:
    """`python train.py argv --out_dir folder --overwrite`, timed whole: its summary's figures."""
    env = dict(os.environ)
    if cold_cache:
        cache = folder.with_name(folder.name + ".compile_cache")
        shutil.rmtree(cache, ignore_errors=True)
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TRITON_CACHE_DIR=str(cache / "triton"))
    log = folder.with_name(folder.name + ".log")
    whole = logged_run(log, [*argv, "--out_dir", str(folder), "--overwrite"], shlex.join(["python", "train.py", *argv]),
                       env=env)
    summary = read_summary(folder)
    if summary is None:
        raise UserError(f"{folder / SUMMARY} cannot be read. See the run's output: {log}")
    return {"full_val_loss": None, **summary, "whole_seconds": whole, "phases": summary.get("seconds", {}),
            "log": str(log)}


def threads_and_estimate(r: dict, before: str) -> str:
    """before + '2 threads, expected 15-18 s' on a CPU; "" elsewhere."""
    parts = [f"{r['threads']} thread{'s' * (r['threads'] != 1)}"] if r.get("threads") else []
    if r.get("expected_seconds"):
        low_high = dict.fromkeys(f"{seconds:.0f}" for seconds in r["expected_seconds"])
        parts.append(f"expected {'-'.join(low_high)} s")
    return before + ", ".join(parts) if parts else ""


@contextlib.contextmanager
def cpu_bound(count: int):
    """count processes, each keeping a core busy while the block runs."""
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


def prepare_nanogpt(checkout: Path, corpus: Path, work: Path) -> Path:
    """The copy's folder: the checkout's code, the corpus as its input.txt, run through its prepare.py."""
    prepare = Path("data", "shakespeare_char", "prepare.py")
    if not (checkout / "train.py").is_file() or not (checkout / prepare).is_file():
        raise UserError(f"--nanogpt {checkout}: not a checkout of karpathy/nanoGPT. Clone it and name its folder")
    code = work / "nanogpt-code"
    shutil.rmtree(code, ignore_errors=True)
    (code / prepare.parent).mkdir(parents=True)
    for source in checkout.glob("*.py"):
        shutil.copyfile(source, code / source.name)
    shutil.copytree(checkout / "config", code / "config")
    shutil.copyfile(checkout / prepare, code / prepare)
    shutil.copyfile(corpus, code / prepare.parent / "input.txt")
    # prepare.py imports requests but downloads nothing here: a stand-in where it is missing
    stand_in = ("import importlib.util, runpy, sys, types\n"
                "if importlib.util.find_spec('requests') is None:\n"
                "    sys.modules['requests'] = types.ModuleType('requests')\n"
                "runpy.run_path('prepare.py', run_name='__main__')")
    logged_run(work / "nanogpt-prepare.log", [], "nanoGPT's prepare.py", program=["-c", stand_in],
               cwd=code / prepare.parent)
    return code


def run_nanogpt(code: Path, folder: Path, dtype: str) -> dict:
    """nanoGPT's CPU recipe in the copy, timed whole; its checkpoint scored as our full validation is, in dtype."""
    from score_nanogpt import score
    from common.machine import setup

    log = folder.with_name(folder.name + ".log")
    shutil.rmtree(folder, ignore_errors=True)
    whole = logged_run(log, [*NANOGPT_CPU_RECIPE, f"--out_dir={folder}"], "nanoGPT's train.py",
                       program=[str(code / "train.py")], cwd=code)
    loss, facts = score(code, folder / "ckpt.pt", setup("cpu", dtype))
    return {"whole_seconds": whole, "full_val_loss": loss, "model_step": facts["step"], "log": str(log)}


def run_all(rest: list[str], variants: list[dict[str, str]], seeds: list[str], out: Path, repeat: int,
            cold_cache: bool, nanogpt: Path | None, dtype: str) -> tuple[dict, list[dict]]:
    """Each variant once per seed and round, nanoGPT first: ({variant: its runs}, nanoGPT's runs)."""
    runs, yardstick = {variant_name(v): [] for v in variants}, []
    say = functools.partial(print, file=sys.stderr, flush=True)
    for round_ in range(1, repeat + 1):
        for seed in seeds or [None]:
            where = f"-s{seed}-r{round_}" if seed is not None else f"-r{round_}"
            if nanogpt is not None:
                say(f"[round {round_}/{repeat}] nanoGPT's CPU recipe")
                yardstick.append(r := run_nanogpt(nanogpt, out / f"nanogpt{where}", dtype))
                say(f"  {r['whole_seconds']:.1f} s whole, full validation {r['full_val_loss']:.4f} "
                    f"(step {r['model_step']})")
            for number, variant in enumerate(variants, start=1):
                extra = options(variant) + (["--seed", seed] if seed is not None else [])
                say(f"[round {round_}/{repeat}] {variant_name(variant)}" + (f", seed {seed}" if seed else ""))
                r = run_once(rest + extra, out / f"{number:02d}{where}", cold_cache)
                runs[variant_name(variant)].append({**r, "seed": seed})
                loss = "" if r["full_val_loss"] is None else \
                    f", full validation {r['full_val_loss']:.4f} (step {r['model_step']})"
                say(f"  {r['whole_seconds']:.1f} s whole, {r['train_seconds']:.1f} s training{loss}"
                    f"{threads_and_estimate(r, ', ')}")
    return runs, yardstick


def row_of(name: str, done: list[dict], nanogpt_seconds: float | None) -> dict:
    """A variant's runs in one row: medians, means, the losses' spread, the time against nanoGPT's."""
    losses = [r["full_val_loss"] for r in done if r["full_val_loss"] is not None]
    wholes = [r["whole_seconds"] for r in done]
    mean_whole = statistics.fmean(wholes)
    return {"variant": name, "whole_seconds": statistics.median(wholes),
            "train_seconds": statistics.median(r.get("train_seconds", 0) for r in done),
            "full_val_loss": statistics.median(losses) if losses else None, "mean_whole_seconds": mean_whole,
            "mean_full_val_loss": statistics.fmean(losses) if losses else None,
            "loss_spread": max(losses) - min(losses) if losses else None,
            "times_nanogpt": mean_whole / nanogpt_seconds if nanogpt_seconds else None, "runs": done}


def figure(value: float | None, spec: str = ".4f", unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def main(argv: list[str] | None = None) -> int:
    parser = figures_parser(__doc__, allow_abbrev=False)  # train.py's --seed is not --seeds
    parser.add_argument("--out_dir", default="out/bench_run", help="a run folder (and .log) per variant and round")
    parser.add_argument("--compare", action="append", default=[], metavar="FIELD=A,B",
                        help="run under each value of a train.py field (repeatable)")
    parser.add_argument("--seeds", default="", metavar="1,2,3", help="run every variant once per seed")
    parser.add_argument("--nanogpt", type=Path, metavar="DIR", help="a nanoGPT checkout: time its CPU recipe too")
    parser.add_argument("--repeat", type=count, default=1, help="rounds: every variant once per round")
    parser.add_argument("--cold_compile_cache", action="store_true", help="an empty torch.compile cache for every run")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="N CPU-bound processes beside every run")
    args, rest = parser.parse_known_args(argv)
    if not 0 <= args.busy <= 64:
        raise UserError(f"--busy {args.busy}: must be from 0 to 64")
    if any(word in ("--out_dir", "--resume", "--overwrite") for word in rest):
        raise UserError("bench_run.py chooses each run's folder. Leave --out_dir, --resume and --overwrite out")
    if args.seeds and ("--seed" in rest or any(word.startswith("--seed=") for word in rest)):
        raise UserError("--seeds chooses each run's seed. Leave --seed out")
    seeds = [seed.strip() for seed in args.seeds.split(",")] if args.seeds else []
    if not all(seed.isdigit() for seed in seeds):
        raise UserError(f"--seeds {args.seeds}: not whole numbers. Give e.g. --seeds 1,2,3")
    cfg = load_config(rest, torch.cuda.is_available())[0]
    if args.nanogpt is not None and not Path(cfg.data).is_file():
        raise UserError("--nanogpt needs the text as a file. Name it with --data FILE")
    variants = parse_compare(args.compare) if args.compare else [{}]
    out = Path(args.out_dir).absolute()  # absolute: nanoGPT's train.py runs in its copy's folder
    owner = RunDir(out).claim(say=lambda message: None)  # one bench_run per folder
    try:
        nanogpt = prepare_nanogpt(args.nanogpt.resolve(), Path(cfg.data), out) if args.nanogpt is not None else None
        with cpu_bound(args.busy):
            runs, yardstick = run_all(rest, variants, seeds, out, args.repeat, args.cold_compile_cache, nanogpt,
                                      cfg.dtype)
    finally:
        owner.release()
    nanogpt_seconds = statistics.fmean(r["whole_seconds"] for r in yardstick) if yardstick else None
    rows = [row_of(name, done, nanogpt_seconds) for name, done in runs.items()]
    if args.busy:
        print(f"(every run beside {args.busy} CPU-bound process{'es' if args.busy > 1 else ''})")
    print_table(["variant", "whole s", "train s", "full-val", "where the time went"], [
        [row["variant"], f"{row['whole_seconds']:.1f}", f"{row['train_seconds']:.1f}", figure(row["full_val_loss"]),
         ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in row["runs"][-1]["phases"].items()
                   if phase != "total" and seconds >= 0.05) + threads_and_estimate(row["runs"][-1], "; ")]
        for row in rows])
    if any(len(row["runs"]) > 1 for row in rows):
        print("(whole s, train s, full-val: medians of each variant's runs; where the time went: its last run)")
    if seeds or yardstick:
        print()
        header = ["variant", "mean full-val", "spread", "mean whole s", "x nanoGPT", "each run (full-val, whole s)"]
        print_table(header, [
            [row["variant"], figure(row["mean_full_val_loss"]), figure(row["loss_spread"]),
             f"{row['mean_whole_seconds']:.1f}", figure(row["times_nanogpt"], ".2f", "x"),
             ", ".join(f"{r['full_val_loss']:.4f} {r['whole_seconds']:.1f}" for r in row["runs"]
                       if r["full_val_loss"] is not None)]
            for row in rows + [row_of("nanoGPT CPU recipe", yardstick, nanogpt_seconds)] * bool(yardstick)])
    write_figures(args.json, {"train_options": rest, "repeat": args.repeat, "cold_compile_cache":
                              args.cold_compile_cache, "busy": args.busy, "seeds": seeds, "variants": rows,
                              "nanogpt": yardstick})
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
