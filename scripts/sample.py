"""python scripts/sample.py --out_dir DIR [--prompt TEXT]: generate text from a trained checkpoint."""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from errors import (ArgumentParser, BooleanFlag, Interrupted, UserError, quiet_while_loading, run_cli,  # noqa: E402
                    shown)

with quiet_while_loading(__name__):
    import torch

    from common.machine import choose_threads, fits_in_memory, for_sampling, setup
    from common.run_folder import find
    from configs.schema import check_num_threads
    from data.gate import read_small, utf8_text
    from model.generate import (NonFiniteLogits, Sampling, bytes_needed, check_length_and_seed, compiled_step,
                                generate, one_token_step)
    from training.checkpoint import load_model

PROMPT_MAX_BYTES = 16 << 20  # a larger prompt file is a corpus, not prompts
PROBE_CHARACTERS = 8  # drawn, uncompiled, to time each thread count


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description="Generate text from a checkpoint written by train.py.")
    p.add_argument("--out_dir", default="", help="a run folder: uses its ckpt_best, else ckpt_last")
    p.add_argument("--ckpt", default="", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--prompt", "--start", default=None,
                   help="text to continue, or FILE:path (default: a newline, else the text's first character)")
    p.add_argument("--prompt_file", default="", help="read the prompt from this file")
    p.add_argument("--prompts_per_line", action="store_true", help="with --prompt_file: one prompt per line, batched")
    p.add_argument("--max_new_tokens", type=int, default=500, help="characters to generate per sample")
    for option in fields(Sampling):
        p.add_argument(f"--{option.name}", type=option.metadata["type"], default=option.default,
                       help=option.metadata["help"])
    p.add_argument("--num_samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=1337, help="same seed and settings give the same text")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--stream", default=None, action=BooleanFlag,
                   help="print the first sample as it is drawn (default: on in a terminal or for one sample)")
    p.add_argument("--unknown", choices=("error", "skip"), default="error",
                   help="prompt characters the model never saw: stop with an error, or skip them")
    p.add_argument("--no_cache", action="store_true", help="recompute the whole context every step (slow)")
    p.add_argument("--init_from", default="resume", help="nanoGPT's flag; only resume works")
    p.add_argument("--num_threads", type=int, default=0,
                   help="CPU threads (0: the faster count, measured; N: the same text whatever the load)")
    p.add_argument("--compile", default=None, action=BooleanFlag,
                   help="torch.compile the decoding step (default: off)")
    return p


def sampling(args: argparse.Namespace) -> Sampling:
    return Sampling(**{option.name: getattr(args, option.name) for option in fields(Sampling)})


def check_settings(args: argparse.Namespace) -> None:
    try:
        sampling(args)
        check_length_and_seed(args.max_new_tokens, args.seed)
    except ValueError as err:
        raise UserError(f"--{err}") from None
    if args.num_samples < 1:
        raise UserError(f"--num_samples {args.num_samples}: must be at least 1")
    if args.init_from != "resume":
        raise UserError(f"--init_from {args.init_from}: only resume works here; give --out_dir RUN or --ckpt FILE")
    args.prompt_flag = "--prompt_file "  # how the prompt's file was named
    if (args.prompt or "").startswith("FILE:"):  # nanoGPT's --start=FILE:prompt.txt
        args.prompt_file, args.prompt, args.prompt_flag = args.prompt.removeprefix("FILE:"), None, "--prompt FILE:"
        if not args.prompt_file:
            raise UserError("--prompt FILE: names no file; give FILE:path")
    if args.prompt is not None and args.prompt_file:
        raise UserError("give --prompt or --prompt_file, not both")
    if args.prompts_per_line and not args.prompt_file:
        raise UserError("--prompts_per_line needs --prompt_file; give one")
    if args.prompt == "":
        raise UserError("--prompt is empty; give a character, or leave it out")
    check_num_threads(args.num_threads)


def read_prompts(args: argparse.Namespace) -> list[str] | None:
    """The prompts given (None: the model's default)."""
    if not args.prompt_file:
        return None if args.prompt is None else [args.prompt]
    named = f"{args.prompt_flag}{args.prompt_file}"
    try:
        data = read_small(Path(args.prompt_file), "the prompt file", PROMPT_MAX_BYTES, "give the start of the text")
    except FileNotFoundError:
        raise UserError(f"{named}: no such file") from None
    except OSError as err:
        raise UserError(f"{named}: cannot be read ({err.strerror or err})") from None
    text = utf8_text(data, named).removeprefix("\ufeff")  # a byte-order mark
    prompts = [line for line in text.splitlines() if line] if args.prompts_per_line else [text]
    if not any(prompts):
        raise UserError(f"{named} is empty; put the prompt{'s, one per line,' if args.prompts_per_line else ''} in it")
    return prompts


def encode_prompts(prompts: list[str], tokenizer, policy: str) -> list[list[int]]:
    missing = tokenizer.unknown("".join(prompts))
    if missing and policy == "error":
        listed = " ".join(repr(ch) for ch in missing[:20]) + (" ..." if len(missing) > 20 else "")
        raise UserError(f"the prompt has {len(missing)} character(s) the model never saw: {listed}; pass --unknown "
                        f"skip to drop them")
    if missing:
        print(f"warning: skipped {len(missing)} character(s) the model never saw", file=sys.stderr)
    encoded = [[tokenizer.stoi[ch] for ch in p if ch in tokenizer.stoi] for p in prompts]
    if any(not e for e in encoded):
        raise UserError("a prompt is empty once unknown characters are skipped; give one the model knows")
    return encoded


def streams(args: argparse.Namespace, rows: int) -> bool:
    """Whether the first row is printed as drawn: by default in a terminal or for one row (so `| head` ends)."""
    return (sys.stdout.isatty() or rows == 1) if args.stream is None else args.stream


def write_samples(args: argparse.Namespace, model, tokenizer, device: torch.device, prompts: list[str]) -> None:
    """Each prompt continued --num_samples times, in one batch."""
    rows = [p for p in encode_prompts(prompts, tokenizer, args.unknown) for _ in range(args.num_samples)]
    texts = [tokenizer.decode(r) for r in rows]
    stream = streams(args, len(rows))
    settings = dict(**asdict(sampling(args)), use_cache=not args.no_cache)
    if device.type == "cpu":
        threads = choose_threads(args.num_threads, lambda: decoding_seconds(model, rows, settings, device))
        print(threads.line(f"{PROBE_CHARACTERS} characters"), file=sys.stderr)
    if args.compile and not args.no_cache:  # else the wait would look like a hang
        took = "20 s on a CPU" if device.type == "cpu" else "10 s on an H100"
        print(f"--compile: compiling the decoding step first (about {took})", file=sys.stderr)
    settings.update(generator=torch.Generator(device=device).manual_seed(args.seed), finite_only=True,
                    step=compiled_step(device.type) if args.compile else one_token_step)
    first = int(stream)  # rows from `first` on are kept and printed at the end
    kept, done = torch.empty(len(rows) - first, args.max_new_tokens, dtype=torch.long), 0
    if stream:
        print(shown(texts[0]), end="", flush=True)

    def keep(ids: torch.Tensor) -> None:  # (B, n): the next n characters of every row
        nonlocal done
        if stream:
            print(shown(tokenizer.decode(ids[0].tolist())), end="", flush=True)
        if len(kept):
            kept[:, done:done + ids.shape[1]] = ids[first:]
        done += ids.shape[1]

    def the_rest() -> str:
        parts = [text + tokenizer.decode(ids) for text, ids in zip(texts[first:], kept[:, :done].tolist())]
        return "\n---\n".join([""] * first + parts)  # after a streamed row, each part opens with ---
    try:
        generate(model, rows, args.max_new_tokens, on_tokens=keep, **settings)
    except KeyboardInterrupt:
        print(shown(the_rest()), flush=True)
        each = " of each sample" if len(rows) > 1 else ""
        raise Interrupted(f"stopped after {done:,} of the {args.max_new_tokens:,} new characters{each}; those are "
                          f"printed") from None
    print(shown(the_rest()))


def decoding_seconds(model, rows: list[list[int]], settings: dict, device: torch.device) -> float:
    start = time.perf_counter()
    generate(model, rows, PROBE_CHARACTERS, generator=torch.Generator(device=device).manual_seed(0), **settings)
    return time.perf_counter() - start


def own_loss(state: dict) -> str:
    """The validation loss measured at the checkpoint's step, if any."""
    val = state.get("last_eval", {}).get("val") if state.get("eval_done") else None
    return f", validation loss {val:.4f}" if isinstance(val, float) and math.isfinite(val) else \
        ", no validation loss measured at this step"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_settings(args)
    rt = setup(args.device, args.dtype, sampling=True)
    prompts = read_prompts(args)
    path = find(args.out_dir, args.ckpt)
    model, tokenizer, state = load_model(path, rt.device)
    rt = for_sampling(rt, args.dtype, model.num_params(non_embedding=False))
    model = model.to(rt.dtype)  # cast once, so decoding needs no autocast
    data = state.get("data") if isinstance(state.get("data"), dict) else {}
    source = shown(str(data.get('source', 'an unrecorded corpus')))
    print(f"{path}: step {state['iter']}{own_loss(state)}, trained on {source}; sampling on "
          f"{rt.device_type} in {str(rt.dtype).removeprefix('torch.')}", file=sys.stderr)  # stdout stays the text
    prompts = prompts or [tokenizer.default_prompt(data.get("first_char"))]
    rows = len(prompts) * args.num_samples
    need = bytes_needed(model, rows, max(map(len, prompts)), args.max_new_tokens, use_cache=not args.no_cache,
                        handed_back=not (rows == 1 and streams(args, rows)))
    with fits_in_memory(need, rt.device, f"{rows:,} sample(s) of {args.max_new_tokens:,} new characters",
                        "lower --max_new_tokens or --num_samples"):
        try:
            write_samples(args, model, tokenizer, rt.device, prompts)
        except NonFiniteLogits:
            if streams(args, rows):
                print()  # end the streamed line
            raise UserError(f"{path}: the model's scores are not numbers (NaN or inf); its weights are damaged or "
                            f"too large") from None
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
