"""python scripts/evaluate.py --out_dir RUN [--data FILE]: a trained model's loss and bits per character on any text,
by default its run's validation split."""
from __future__ import annotations

import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import (ArgumentParser, UserError, check_output_file, disk_error, quiet_while_loading,  # noqa: E402
                    run_cli, shown)

with quiet_while_loading(__name__):
    import numpy as np
    import torch
    from tqdm import tqdm

    from common.machine import Runtime, choose_threads, fits_in_memory, pick_device, setup
    from common.run_folder import CHECKPOINTS, SUMMARY, find, write_text_atomic
    from configs import TrainConfig
    from configs.loader import config_from_dict
    from configs.schema import check_num_threads
    from data.corpus import NAMED, default_cache_dir, resolve
    from data.gate import recorded_size, recorded_text
    from data.loader import Windows, check_stride
    from data.prepare import check_encoding, read_text
    from training import checkpoint
    from training.evaluation import score
    from training.report import PlainProgress


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--data", default=None, help="text file, folder or named corpus (default: the run's own text)")
    p.add_argument("--split", choices=("val", "all"), default="val",
                   help="val: the held-out last part; all: the whole text")
    p.add_argument("--stride", type=int, default=None,
                   help="characters between window starts (default and at most: block_size)")
    p.add_argument("--unknown", choices=("error", "skip"), default="error",
                   help="characters the model never saw: stop with an error, or skip them")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    p.add_argument("--batch_size", type=int, default=0, help="windows per batch (default: the run's batch_size)")
    p.add_argument("--cache_dir", default="", help="where named corpora are downloaded")
    p.add_argument("--encoding", default=None, help="--data's encoding, e.g. latin-1 (default: the run's own)")
    p.add_argument("--encoding_errors", default=None, choices=("strict", "replace", "ignore"),
                   help="undecodable bytes: stop, replace or ignore them (default: the run's own)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="", help="auto | float32 | bfloat16 (default: the run's own)")
    p.add_argument("--num_threads", type=int, default=0,
                   help="CPU threads (0: the faster count, measured; N: the same figures whatever the load)")
    return p


def read_corpus(spec: str, cache_dir: str, encoding: str, errors: str, digest=None) -> tuple[str, str]:
    """The text of --data and its name; digest, when given, takes its bytes."""
    corpus = resolve(spec, Path(cache_dir) if cache_dir else default_cache_dir(),
                     say=lambda message: print(message, file=sys.stderr))
    return "".join(read_text(corpus, encoding, errors, digest)), corpus.name


def runs_own_text(args, run: TrainConfig, state: dict, path: Path) -> tuple[str, str]:
    """No --data: the text the run trained on, a file only if its size and checksum are the checkpoint's."""
    record = state.get("data") or {}
    if run.data in NAMED:
        digest = hashlib.sha256()
        try:
            text, name = read_corpus(run.data, args.cache_dir, run.encoding, run.encoding_errors, digest)
        except UserError as err:
            raise UserError(f"no --data given; the run trained on {shown(run.data)}, and "
                            f"{str(err).removeprefix(f'--data {run.data}: ')}") from None
        if record.get("sha256") not in (None, digest.hexdigest()):
            print(shown(f"note: {name} here is not the text {path} was trained on (its checksum differs)"),
                  file=sys.stderr)
        return text, name
    source = Path(run.data).expanduser()
    if source.is_dir():
        raise UserError(f"no --data given: {path} was trained on the folder {shown(run.data)}; give --data "
                        f"{shlex.quote(shown(run.data))}")
    why = "it is missing" if not source.exists() else recorded_size(source, record)
    if why is None:
        why = "it is not the text it was trained on (its checksum differs)"
        try:
            raw = recorded_text(source, record, 1 << 40)
            if raw is not None:
                return raw.decode(run.encoding, run.encoding_errors), str(source)
        except OSError as err:
            why = f"it cannot be read ({disk_error(err)})"
        except UnicodeError:
            why = f"it does not decode as {run.encoding}"
        except UserError:
            why = "it changed while it was read"
    raise UserError(f"no --data given, and the text {path} was trained on, {shown(run.data)}, is not here as it was: "
                    f"{why}; give it with --data FILE")


def batch_bytes(model, batch_size: int, block_size: int) -> int:
    """A batch's memory: its float32 logits three times, and eight activations a layer."""
    cfg = model.config
    return 4 * batch_size * block_size * (3 * cfg.vocab_size + 8 * cfg.n_embd * max(cfg.n_layer, 1))


def settings(args, state: dict, path: Path) -> tuple[TrainConfig, Runtime]:
    """The run's saved settings with --encoding over them, and the runtime; a bad saved value blames the checkpoint."""
    run = config_from_dict(state["run_config"], f"{path}", say=lambda message: None)
    try:
        check_encoding(run.encoding, run.encoding_errors)
    except UserError as err:
        raise UserError(f"{path} is damaged: its run config's {str(err).removeprefix('--')}") from None
    if args.encoding is not None or args.encoding_errors is not None:
        if args.data is None:
            raise UserError("--encoding and --encoding_errors need --data; leave them out, or give --data FILE")
        run.encoding, run.encoding_errors = args.encoding or run.encoding, args.encoding_errors or run.encoding_errors
        check_encoding(run.encoding, run.encoding_errors)
    try:
        return run, setup(args.device, args.dtype or run.dtype)
    except UserError as err:
        if args.dtype:
            raise
        raise UserError(f"{path}: the run's saved dtype, {run.dtype}, cannot be used here "
                        f"({str(err).split(': ', 1)[-1]}); pass --dtype float32 or bfloat16") from None


def batch_seconds(model, ids: torch.Tensor, block_size: int, stride: int, batch_size: int, autocast) -> float:
    """Seconds to score the first batch, to time a thread count."""
    n_ids = min(len(ids), (batch_size - 1) * stride + block_size + 1)
    start = time.perf_counter()
    score(model, ids[:n_ids], Windows(n_ids, block_size, stride), batch_size, autocast)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json:
        target = check_output_file(args.json, "--json", (".json",))
        if target.name == SUMMARY and any((target.parent / name).exists() for name in CHECKPOINTS):
            raise UserError(f"--json {args.json} would replace the run's own summary; give another file, e.g. "
                            f"--json {shlex.quote(str(target.with_name('evaluation.json')))}")
    check_num_threads(args.num_threads)
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, state = checkpoint.load_model(path, pick_device(args.device))
    run, rt = settings(args, state, path)
    block_size = model.config.block_size
    stride = block_size if args.stride is None else args.stride
    try:
        check_stride(stride, block_size)
    except ValueError as err:
        raise UserError(f"--{err}") from None
    if args.batch_size < 0:
        raise UserError(f"--batch_size {args.batch_size}: must be 1 or more (or 0, the run's own)")
    batch_size = args.batch_size or run.batch_size

    if args.data is not None:
        text, name = read_corpus(args.data, args.cache_dir, run.encoding, run.encoding_errors)
    else:
        text, name = runs_own_text(args, run, state, path)
        if args.split == "all":
            print("note: --split all on the run's own text scores its training part too", file=sys.stderr)
    if args.split == "val":  # training's split: the last val_fraction
        text = text[int(len(text) * (1 - run.val_fraction)):]
    counts = {ch: text.count(ch) for ch in tokenizer.unknown(text)}
    if counts and args.unknown == "error":
        listed = " ".join(repr(ch) for ch in list(counts)[:20]) + (" ..." if len(counts) > 20 else "")
        raise UserError(f"--data {args.data or name}: {sum(counts.values())} characters the model never saw "
                        f"({len(counts)} different: {listed}); pass --unknown skip to leave them out")
    known = "".join(ch for ch in text if ch in tokenizer.stoi) if counts else text
    if len(known) < 2:
        raise UserError(f"--data {args.data or name}: no text to score"
                        f"{' once unknown characters are left out' if counts else ''}"
                        f"; give at least two characters the model knows")
    ids = torch.from_numpy(tokenizer.encode_array(known).astype(np.int32))

    dtype = str(rt.dtype).removeprefix("torch.")
    print(shown(f"{path}: step {state['iter']}, block_size {block_size}; scoring {len(ids) - 1:,} characters of "
                f"{name} ({args.split}), stride {stride}, in {dtype}"), file=sys.stderr)
    todo = Windows(len(ids), block_size, stride)
    with fits_in_memory(batch_bytes(model, batch_size, block_size), rt.device,
                        f"batches of {batch_size:,} windows of {block_size} characters", "lower --batch_size"):
        if rt.device_type == "cpu":
            threads = choose_threads(args.num_threads, lambda: batch_seconds(model, ids, block_size, stride,
                                                                             batch_size, rt.autocast))
            print(threads.line("a batch"), file=sys.stderr)
        bar = tqdm(total=len(todo), desc="evaluate", unit="window", delay=2, dynamic_ncols=True) if \
            sys.stderr.isatty() else PlainProgress(lambda line: print(line, file=sys.stderr), "evaluate", len(todo),
                                                   unit="windows")
        with bar:
            nats, scored = score(model, ids, todo, batch_size, rt.autocast, bar)
    loss = nats / scored
    if not math.isfinite(loss):
        raise UserError(f"{path}: the model's loss on this text is not a number ({loss}); its weights are damaged "
                        f"or too large")
    perplexity = math.exp(loss) if loss < 709 else None  # math.exp overflows past 709.78
    figures = {"loss": loss, "bits_per_char": loss / math.log(2), "perplexity": perplexity, "characters": scored,
               "unknown": sum(counts.values()), "unknown_distinct": len(counts), "stride": stride,
               "block_size": block_size, "split": args.split, "dtype": dtype, "data": name, "checkpoint": str(path),
               "step": state["iter"]}
    skipped = f"; {figures['unknown']:,} unknown characters left out" if counts else ""
    perplexity_text = f"{perplexity:.2f}" if perplexity is not None else f"e^{loss:.0f} (too large for a number)"
    print(f"loss {loss:.4f} nats per character, {figures['bits_per_char']:.3f} bits per character, perplexity "
          f"{perplexity_text}, over {scored:,} characters{skipped}")
    if args.json:
        write_text_atomic(target, json.dumps(figures, indent=1, allow_nan=False) + "\n", "the figures file",
                          "--json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
