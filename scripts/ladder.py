"""python scripts/ladder.py --data FILE --out_dir DIR: what each part of attention buys, measured. Trains models
from a bigram table to the full model and its variants, one budget each; close rungs get more seeds. Writes
DIR/ladder.json and DIR/ladder.png."""
from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import quiet_while_loading  # noqa: E402

loaded = quiet_while_loading(__name__)  # a Ctrl-C while torch loads: one line

import torch  # noqa: E402

from common.run_folder import LAST, SUMMARY, RunDir, read_summary, write_text_atomic  # noqa: E402
from configs import load_config  # noqa: E402
from configs.fit import PRESET, chosen as fit_settings, fitted_line  # noqa: E402
from data import resolve  # noqa: E402
from data.corpus import NAMED, default_cache_dir  # noqa: E402
from data.gate import read_small  # noqa: E402
from data.prepare import corpus_key, prepare  # noqa: E402
from errors import ArgumentParser, Interrupted, QuietExit, UserError, disk_error, python_command  # noqa: E402
from errors import output_folder, run_cli  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from training import checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_command import run_train  # noqa: E402
loaded()


# Rungs 2-5 take blocks apart; each later rung puts a part back.
TAKEN_APART = {"n_layer": "1", "position": "learned", "mlp": "false", "residual": "false"}
RUNGS = [
    ("bigram", "each character predicts the next from itself alone: a table of odds",
     {"n_layer": "0", "position": "none", "tie_weights": "false"}),
    ("average", "+ the past, as a plain average of every earlier character",
     {**TAKEN_APART, "attention_score": "uniform", "n_head": "1"}),
    ("one_head", "+ learned attention: one head's queries and keys choose whom to average",
     {**TAKEN_APART, "n_head": "1"}),
    ("heads", "+ several smaller heads, each free to look for something else", TAKEN_APART),
    ("feed_forward", "+ a feed-forward network: each position works on what it gathered",
     {**TAKEN_APART, "mlp": "true"}),
    ("full_block", "+ residual connections and LayerNorm: the full transformer block",
     {"n_layer": "1", "position": "learned"}),
    ("default", "the preset itself", {}),
    ("unscaled", "the default without the 1/sqrt(head_size) scale", {"attention_score": "dot"}),
    ("additive", "the default with additive scores, w·tanh(q + k)", {"attention_score": "additive"}),
    ("shared_qk", "the default with queries and keys from one projection (Q = K)", {"shared_qk": "true"}),
    ("no_values", "the default without a value projection", {"attention_values": "false"}),
    ("no_positions", "the default without any position information", {"position": "none"}),
]
NAMES = [name for name, _, _ in RUNGS]
FIXED = {"sample_chars": "0", "log_attention": "false", "patience": "0"}  # each rung trains all its steps
NOT_THE_RUN = {"out_dir", "resume", "overwrite", "data"}  # the text is compared by its sha256
POSITIONS = {"rope": "rotary positions", "learned": "a learned position table", "none": "no positions"}
DEFAULT = 7  # the variants after the default rung are compared with it
SEEDS = 3  # seeds of each of two rungs whose losses are CLOSE
CLOSE = 0.03  # a relative loss difference one seed cannot settle


def reference(number: int) -> int | None:
    """The rung a rung is compared with: the one before it, then the default."""
    return None if number == 1 else number - 1 if number <= DEFAULT else DEFAULT


def rung_argv(args, index: int, name: str, overrides: dict, passed: list[str] = (), seed: int | None = None
              ) -> list[str]:
    """The rung's train.py arguments: the ladder's, the fit's, the passed ones, then the rung's own."""
    folder = f"{index:02d}-{name}" + (f"-seed{seed}" if seed is not None else "")
    argv = ["--config", args.config, "--data", args.data, "--out_dir", str(Path(args.out_dir) / folder)]
    if args.cache_dir:
        argv += ["--cache_dir", args.cache_dir]
    if args.max_iters is not None:
        argv += ["--max_iters", str(args.max_iters)]
    fitted = getattr(args, "fitted", {})  # configs.fit's settings, where the rung has none of its own
    argv += [word for key, value in fitted.items() if key not in overrides for word in (f"--{key}", str(value))]
    argv += passed
    for key, value in {**FIXED, **overrides}.items():
        argv += [f"--{key}", value]
    return argv + (["--seed", str(seed)] if seed is not None else [])


def say(message: str) -> None:
    print(message, file=sys.stderr)


def notes_and_warnings(line: str) -> None:
    if line.startswith(("note", "warning")):
        say(f"  {line}")


def state_of(cfg, text_sha256: str) -> tuple[str, str]:
    """(new | finished | unfinished | different | damaged, why); the last two train again."""
    folder = Path(cfg.out_dir)
    ckpt = folder / LAST
    if not ckpt.exists():
        return "new", ""
    try:
        state = checkpoint.load(ckpt)
    except UserError as err:
        return "damaged", str(err)
    saved, wanted = state["run_config"], cfg.to_dict()
    if not wanted["num_threads"]:  # 0: the rung measures its count, and its run keeps the count it chose
        wanted["num_threads"] = saved.get("num_threads")
    if any(saved.get(key) != wanted[key] for key in wanted if key not in NOT_THE_RUN):
        return "different", f"{cfg.out_dir} holds a run with other settings"
    trained_on = state.get("data") if isinstance(state.get("data"), dict) else {}
    if trained_on.get("sha256") != text_sha256:
        return "different", f"{cfg.out_dir} holds a run trained on another text ({trained_on.get('source', '?')})"
    if not (folder / SUMMARY).exists():
        return "unfinished", ""
    if summary_of(folder) is None:
        return "damaged", f"{folder / SUMMARY} cannot be read"
    return "finished", ""


LEFT_OUT = {"different": "other settings or another text", "unfinished": "unfinished", "damaged": "damaged"}


def fit_to_text(args, passed: list[str]) -> None:
    """Every rung starts from the default preset fitted to the text, as train.py fits a default run; a flag passed to
    every rung wins over the fit's."""
    cfg = load_config([*rung_argv(args, 7, "default", {}), *passed], torch.cuda.is_available())[0]
    budget = [] if args.max_iters is None else ["--max_iters", str(args.max_iters)]
    given = load_config([*passed, *budget], False)[2]
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    quiet = lambda message: None  # noqa: E731 (decide_corpus said where the text is from)
    meta = prepare(resolve(cfg.data, cache_dir, say=quiet), cache_dir, cfg.val_fraction, cfg.encoding,
                   cfg.encoding_errors, say=quiet).meta
    args.fitted = fit_settings(meta["n_train"], meta["vocab_size"], given, cfg.n_head)
    if args.fitted:
        say(fitted_line(meta["n_train"], meta["vocab_size"], args.fitted))


def decide_corpus(args, say=lambda message: None) -> tuple[str, str]:
    """The --data every rung trains on, decided once, and its sha256."""
    cfg = load_config(rung_argv(args, 1, RUNGS[0][0], RUNGS[0][2], []), torch.cuda.is_available())[0]
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    corpus = resolve(cfg.data, cache_dir, say=say, fallback=True)
    data = corpus.name if cfg.data in NAMED else cfg.data
    return data, corpus_key(corpus, cfg.encoding, cfg.encoding_errors, cfg.val_fraction)[0]


def summary_of(folder: Path) -> dict | None:
    summary = read_summary(folder)
    if summary is None or any(type(summary.get(key)) not in (int, float)
                              for key in ("full_val_loss", "train_seconds", "iterations")):
        return None
    return summary  # a NaN loss is a result


TABLE = "ladder.json"
ROW_KEYS = {"rung", "name", "full_val_loss", "out_dir"}


def check_table(path: Path) -> None:
    """Refuse a ladder.json this script did not write."""
    if path.is_symlink() or path.is_dir():
        why = "a link" if path.is_symlink() else "a folder"
    elif not path.exists():
        return
    else:
        try:
            table = json.loads(read_small(path, "the ladder table", 1 << 20).decode("utf-8"))
        except OSError as err:
            raise UserError(f"{path} cannot be read ({disk_error(err)}); choose another --out_dir") from None
        except ValueError:  # UnicodeDecodeError too
            why = "not JSON"
        else:
            rungs = isinstance(table, list) and all(isinstance(row, dict) and ROW_KEYS <= row.keys() for row in table)
            why = "" if rungs else "JSON, but not a list of rungs"
    if why:
        raise UserError(f"{path} is not a ladder table ({why}). Move it away, or choose another --out_dir")


def finite_or_none(value: float) -> float | None:
    """NaN as null: strict JSON has no NaN."""
    return value if math.isfinite(value) else None


def draw(rows: list[dict], path: Path) -> None:
    from common.pictures import plt, save_figure

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2), dpi=100)
    losses = [row["full_val_loss"] for row in rows]  # finite, or None
    drawn = [loss or 0.0 for loss in losses]
    ax.barh([f"{row['rung']}. {row['name']}" for row in rows], drawn,
            color=["C0" if row["rung"] <= DEFAULT else "C1" for row in rows])  # blue: the rungs that build the model
    for y, loss in enumerate(losses):
        ax.text(drawn[y], y, " no loss (the run diverged)" if loss is None else f" {loss:.3f}",
                va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(max(drawn), 1.0) * 1.12)  # from 0: bars compare by eye
    ax.set_xlabel("full-validation loss (nats per character; lower is better)")
    ax.set_title("each rung adds one part (blue); variants of the default (orange)")
    fig.tight_layout()
    save_figure(fig, path, "--out_dir")
    plt.close(fig)


def train_rung(name: str, argv: list[str], state: str, why: str, program: list[str]) -> None:
    if why:
        say(f"  {why}: training this rung again")
    how = {"unfinished": ["--resume"], "new": []}.get(state, ["--overwrite"])
    say(f"  {shlex.join([*program, *argv, *how])}")
    started = time.perf_counter()
    code = run_train(argv + how, each_line=notes_and_warnings)
    if code == 130:
        raise Interrupted(f"stopped during rung {name}; run the same command again to go on")
    if code == 2:
        raise QuietExit(f"rung {name} failed")  # train.py has said why
    if code != 0:
        raise UserError(f"rung {name}: train.py ended with exit code {code}; its command is above")
    say(f"  {time.perf_counter() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip(),
                            epilog="Any other train.py option (--device cpu, --seed 2, ...) goes to every rung; "
                                   "a rung's own settings win.")
    parser.add_argument("--data", default="shakespeare", help="text file, folder, or named corpus (as train.py)")
    parser.add_argument("--out_dir", default="out/ladder", help="the ladder's folder: one run folder per rung")
    parser.add_argument("--config", help=f"the preset every rung starts from (default: {PRESET}, fitted to a small "
                                          "text as train.py fits it)")
    parser.add_argument("--max_iters", type=int, help="training steps per rung (default: the preset's)")
    parser.add_argument("--cache_dir", default="", help="as train.py --cache_dir")
    parser.add_argument("--rungs", help=f"a comma-separated subset of: {', '.join(NAMES)}")
    args, passed = parser.parse_known_args(argv)
    if any(word.split("=")[0] in ("--resume", "--overwrite") for word in passed):
        raise UserError("the ladder resumes and retrains rungs itself: leave out --resume and --overwrite")
    chosen = set(NAMES) if args.rungs is None else {n.strip() for n in args.rungs.split(",") if n.strip()}
    if not chosen or (unknown := sorted(chosen - set(NAMES))):
        raise UserError(f"--rungs: {f'no rung {unknown[0]}' if chosen else 'names no rung'}; choose from "
                        f"{', '.join(NAMES)}")
    out = Path(args.out_dir)
    if held := [path.name for path in (*RunDir(out).checkpoints(), *RunDir(out).logs())]:
        raise UserError(f"--out_dir {out} holds a training run ({', '.join(sorted(held)[:3])}); choose another "
                        f"--out_dir")
    check_table(out / TABLE)
    with output_folder(out, "--out_dir"):
        return climb(args, out, chosen, passed)


def climb(args, out: Path, chosen: set[str], passed: list[str]) -> int:
    """Train or reuse each chosen rung, with more seeds where rungs are close; write the results."""
    fitted, args.config = args.config is None, args.config or PRESET
    args.data, text_sha256 = decide_corpus(args, say=say)
    if fitted:
        fit_to_text(args, passed)
    program = shlex.split(python_command("train.py"))
    rows, left_out, done = {}, [], 0

    def measure(number: int, seed: int | None = None) -> dict | None:
        """One seed of a rung: its summary, or None if left out of the table."""
        nonlocal done
        name, what, overrides = RUNGS[number - 1]
        argv = rung_argv(args, number, name, overrides, passed, seed)
        cfg = load_config(argv, torch.cuda.is_available())[0]
        if not cfg.full_val:
            raise UserError("the ladder compares full-validation losses: leave out --full_val false")
        state, why = state_of(cfg, text_sha256)
        if name in chosen:
            done += seed is None
            say(f"[{done}/{len(chosen)}] {name}: {what}" if seed is None else f"  {name}, seed {seed}")
            if state == "finished":
                say(f"  reused {cfg.out_dir} (finished, same settings)")
            else:
                train_rung(name, argv, state, why, program)
        elif state != "finished":
            if state != "new" and seed is None:
                left_out.append((name, LEFT_OUT[state]))
            return None
        folder = Path(cfg.out_dir)
        if (summary := summary_of(folder)) is None:
            raise UserError(f"rung {name}: {folder / SUMMARY} cannot be read. Run the same command again")
        saved = checkpoint.load(folder / LAST)["model_config"]
        summary.update(seed=cfg.seed, position=cfg.position, out_dir=cfg.out_dir, command=shlex.join([*program, *argv]),
                       parameters=GPT(ModelConfig(**saved)).num_params(non_embedding=False))
        return summary

    for number, (name, what, overrides) in enumerate(RUNGS, start=1):
        if (summary := measure(number)) is not None:
            what += f" ({POSITIONS[summary['position']]})" if name == "default" else ""
            rows[number] = {"rung": number, "name": name, "what": what, "settings": overrides,
                            "parameters": summary["parameters"], "runs": [summary]}
    close = {n for number, row in rows.items() if (ref := rows.get(reference(number)))
             and abs(row["runs"][0]["full_val_loss"] - ref["runs"][0]["full_val_loss"])
             < CLOSE * abs(ref["runs"][0]["full_val_loss"]) for n in (number, reference(number))}
    for number in sorted(close):
        first = rows[number]["runs"][0]["seed"]
        for seed in range(first + 1, first + SEEDS):
            if (summary := measure(number, seed)) is not None:
                rows[number]["runs"].append(summary)
    table = [finish_row(row, rows) for row in rows.values()]
    print_table(table)
    write_text_atomic(out / TABLE, json.dumps(table, indent=1, allow_nan=False) + "\n", "the ladder table")
    draw(table, out / "ladder.png")
    measured_before = len(rows) - len(chosen)
    before = f" ({measured_before} of its rungs measured before)" if measured_before else ""
    say(f"\nwrote {out / TABLE}{before} and {out / 'ladder.png'}; curves: tensorboard --logdir {out}")
    if left_out:
        say(f"note: the table leaves out rungs with no finished run of these settings: "
            f"{', '.join(f'{name} ({why})' for name, why in left_out)}; --rungs "
            f"{','.join(name for name, _ in left_out)} trains them with these")
    return 0


def finish_row(row: dict, rows: dict) -> dict:
    """A table row: the mean loss over its seeds, and how it compares."""
    runs = row.pop("runs")
    losses = [run["full_val_loss"] for run in runs]
    mean = sum(losses) / len(losses)
    row.update(full_val_loss=finite_or_none(mean), bits_per_char=finite_or_none(mean / math.log(2)),
               seeds=[run["seed"] for run in runs], seed_losses=[finite_or_none(loss) for loss in losses],
               model_steps=[run.get("model_step") for run in runs], steps=runs[0]["iterations"],
               train_seconds=sum(run["train_seconds"] for run in runs), corpus=runs[0].get("corpus", "?"),
               out_dir=runs[0]["out_dir"], command=runs[0]["command"], compared="")
    ref = rows.get(reference(row["rung"]))
    if ref is not None and row["full_val_loss"] is not None and ref.get("full_val_loss") is not None:
        ref_losses = ref["seed_losses"]
        within = len(losses) > 1 and min(losses) <= max(ref_losses) and min(ref_losses) <= max(losses)
        row["compared"] = (f"{row['full_val_loss'] - ref['full_val_loss']:+.3f} vs {ref['name']}"
                           + (" (within the spread of seeds)" if within else ""))
    return row


def print_table(table: list[dict]) -> None:
    print(f"\n{'rung':<14}{'parameters':>11}{'full-val loss':>15}{'seeds (min-max)':>22}{'model steps':>16}  compared")
    for row in table:
        loss = row["full_val_loss"]
        known = [x for x in row["seed_losses"] if x is not None]
        spread = f"{len(known)}: {min(known):.4f}-{max(known):.4f}" if len(row["seeds"]) > 1 and known else ""
        steps = ",".join(str(step) for step in row["model_steps"])
        print(f"{row['name']:<14}{row['parameters']:>11,}{'no loss' if loss is None else f'{loss:.4f}':>15}"
              f"{spread:>22}{steps:>16}  {row['compared']}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
