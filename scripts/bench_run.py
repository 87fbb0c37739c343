"""python scripts/bench_run.py [train.py options] [--compare FIELD=A,B] [--repeat N]: whole training commands, timed
as a user lives them: `python train.py ...` from the command to the prompt (start-up, data, compilation, evaluations
and the final validation included), with the loss of the model each run hands over and where its time went. The
question it answers: which recipe reaches a given loss soonest, whole command. Variants run in turn, each in its own
folder under --out_dir; --cold_compile_cache gives every run an empty compiler cache (what a first run pays)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import parse_compare  # noqa: E402
from errors import ArgumentParser, Interrupted, UserError, exit_without_teardown, run_cli  # noqa: E402
from train_command import run_train  # noqa: E402
from training.run_folder import check_output_file, write_text_atomic  # noqa: E402
from training.run_folder import RunDir  # noqa: E402



def variant_name(variant: dict[str, str]) -> str:
    return ",".join(f"{field}={value}" for field, value in variant.items()) or "as given"


def run_once(argv: list[str], folder: Path, cold_cache: bool) -> dict:
    """One `python train.py argv --out_dir folder --overwrite`, timed from outside; its summary.json figures. Its output
    goes to folder.log."""
    env = dict(os.environ)
    if cold_cache:  # an empty compiler cache for this run alone: inductor's, and triton's kernels inside it
        cache = folder.with_name(folder.name + ".compile_cache")
        shutil.rmtree(cache, ignore_errors=True)  # left by an earlier bench_run in the same --out_dir
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        env["TRITON_CACHE_DIR"] = str(cache / "triton")  # where inductor puts it, unless the user's setting says
    log = folder.with_name(folder.name + ".log")
    started = time.perf_counter()
    # O_NOFOLLOW: a link planted under the log's name is refused (ELOOP), never written through
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "w", encoding="utf-8") as out:
        code = run_train([*argv, "--out_dir", str(folder), "--overwrite"], output=out, env=env)
    whole = time.perf_counter() - started
    if code == 130:  # the run was stopped (and saved what it had): so is the benchmark
        raise Interrupted(f"stopped; the run in {folder} saved its last step (its output: {log})")
    if code != 0:
        last = (log.read_text(encoding="utf-8", errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{shlex.join(['python', 'train.py', *argv])}: {last.removeprefix('error: ')[:300]} "
                        f"(exit code {code}; its output: {log})")
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    seconds = summary.get("seconds", {})
    return {"whole_seconds": whole, "train_seconds": summary["train_seconds"],
            "first_step_seconds": summary.get("first_step_seconds"), "full_val_loss": summary.get("full_val_loss"),
            "model_step": summary["model_step"], "iterations": summary["iterations"],
            "stopped_early": summary["stopped_early"], "device": summary["device"], "phases": seconds, "log": str(log)}


def run_all(rest: list[str], variants: list[dict[str, str]], out: Path, repeat: int, cold_cache: bool) -> dict:
    """Every variant once per round, in turn: {variant name: its runs' figures}."""
    runs = {variant_name(v): [] for v in variants}
    for round_ in range(1, repeat + 1):
        for number, variant in enumerate(variants, start=1):
            name = variant_name(variant)
            extra = [part for field, value in variant.items() for part in (f"--{field}", value)]
            print(f"[round {round_}/{repeat}] {name}", file=sys.stderr, flush=True)
            r = run_once(rest + extra, out / f"{number:02d}-r{round_}", cold_cache)
            runs[name].append(r)
            loss = ("" if r["full_val_loss"] is None else
                    f", full validation {r['full_val_loss']:.4f} (step {r['model_step']})")
            print(f"  {r['whole_seconds']:.1f} s whole, {r['train_seconds']:.1f} s training{loss}", file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--out_dir", default="out/bench_run", help="one run folder (and .log) per variant and repeat")
    parser.add_argument("--compare", action="append", default=[], metavar="FIELD=A,B",
                        help="run under each value of a train.py field (repeat for more fields: every combination)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds: every variant once per round, in turn")
    parser.add_argument("--cold_compile_cache", action="store_true",
                        help="an empty torch.compile cache for every run (by default this machine's cache is used)")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    args, rest = parser.parse_known_args(argv)
    if args.repeat < 1:
        raise UserError("--repeat must be at least 1")
    if any(word in ("--out_dir", "--resume", "--overwrite") for word in rest):
        raise UserError("bench_run.py chooses each run's folder (under its own --out_dir) and starts it afresh: "
                        "leave --out_dir, --resume and --overwrite out of the train.py options")
    if args.json:
        check_output_file(args.json, "--json")
    variants = parse_compare(args.compare) if args.compare else [{}]
    out = Path(args.out_dir)
    owner = RunDir(out).claim(say=lambda message: None)  # one bench_run per folder: the runs' logs lie side by side
    try:
        runs = run_all(rest, variants, out, args.repeat, args.cold_compile_cache)
    finally:
        owner.release()
    rows = [{"variant": name, "whole_seconds": statistics.median(r["whole_seconds"] for r in done),
             "train_seconds": statistics.median(r["train_seconds"] for r in done), "runs": done}
            for name, done in runs.items()]
    print(f"{'variant':<32}{'whole s':>9}{'train s':>9}{'full-val':>10}  where the time went (the last round)")
    for row in rows:
        last = row["runs"][-1]
        phases = ", ".join(f"{phase} {seconds:.1f}" for phase, seconds in last["phases"].items()
                           if phase != "total" and seconds >= 0.05)
        loss = f"{last['full_val_loss']:.4f}" if last["full_val_loss"] is not None else "-"
        print(f"{row['variant']:<32}{row['whole_seconds']:>9.1f}{row['train_seconds']:>9.1f}{loss:>10}  {phases}")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps({"train_options": rest, "repeat": args.repeat,
                                                       "cold_compile_cache": args.cold_compile_cache,
                                                       "variants": rows}, indent=1) + "\n",
                          "the figures file", "--json")
    return 0


if __name__ == "__main__":
    exit_without_teardown(run_cli(main))
