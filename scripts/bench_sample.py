"""python scripts/bench_sample.py: characters/s of generation (6x6x384, block 256): one stream and a batch, with and
without the KV cache, eager and with a compiled decoding step, timed in turn, round after round, in one process."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from model import GPT, ModelConfig  # noqa: E402
from model.generate import compiled_step, generate, one_token_step  # noqa: E402
from training import runtime  # noqa: E402
from training.perf import sync  # noqa: E402


def variants_of(batch: int, compile: bool) -> list[tuple[str, int, bool, bool]]:
    """(name, rows, cached, compiled) of each measurement; the whole-window recompute only for one stream (it is slow)."""
    out = [("cached", 1, True, False), ("uncached", 1, False, False), (f"batch{batch}_cached", batch, True, False)]
    if compile:
        out += [("compiled", 1, True, True), (f"batch{batch}_compiled", batch, True, True)]
    return out


def bench_sampling(model: GPT, rt: runtime.Runtime, new_tokens: int, batch: int = 8, compile: bool = False,
                   rounds: int = 1, say=lambda message: None) -> dict:
    """sample_chars_per_sec_<variant> (characters of all rows per second, the median of the rounds), the cache's
    speed-up for one stream, and whether every variant drew the same tokens (greedy) for the first row."""
    model.eval()
    steps = {False: one_token_step}
    if compile:
        steps[True] = compiled_step(rt.device_type)
    variants = variants_of(batch, compile)
    seconds = {name: [] for name, *_ in variants}
    texts = {}
    with rt.autocast():
        for name, rows, cached, compiled in variants:  # warm-up: compilation, allocator, kernels' plans
            start = time.perf_counter()
            generate(model, [[0]] * rows, 8, temperature=0, use_cache=cached, step=steps[compiled])
            sync(rt.device)
            if compiled:
                say(f"  compiled the decoding step for {rows} row(s) in {time.perf_counter() - start:.1f} s")
        for _ in range(rounds):
            for name, rows, cached, compiled in variants:
                sync(rt.device)
                start = time.perf_counter()
                texts[name] = generate(model, [[0]] * rows, new_tokens, temperature=0, use_cache=cached,
                                       step=steps[compiled])[0]
                sync(rt.device)
                seconds[name].append(time.perf_counter() - start)
    out = {f"sample_chars_per_sec_{name}": rows * new_tokens / statistics.median(seconds[name])
           for name, rows, *_ in variants}
    out["sample_cache_speedup"] = out["sample_chars_per_sec_cached"] / out["sample_chars_per_sec_uncached"]
    out["sample_same_tokens"] = all(text == texts["cached"] for text in texts.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--new_tokens", type=int, default=500)
    parser.add_argument("--n_layer", type=int, default=6)
    parser.add_argument("--n_head", type=int, default=6)
    parser.add_argument("--n_embd", type=int, default=384)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="rows of the batched measurement")
    parser.add_argument("--rounds", type=int, default=3, help="times each variant is timed, in turn")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="also time a compiled decoding step (default: on CUDA only; on a CPU compiling takes "
                             "about half a minute)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto (autocast)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=65, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                      n_embd=args.n_embd)
    rt = runtime.setup(args.device, args.dtype, sampling=True)
    compile = rt.device_type == "cuda" if args.compile is None else args.compile
    model = GPT(cfg).to(rt.device)  # random weights: speed does not depend on what the model learned
    print(f"generating {args.new_tokens} characters with a {args.n_layer}x{args.n_head}x{args.n_embd} model on "
          f"{rt.describe()}: {', '.join(name for name, *_ in variants_of(args.batch, compile))}, {args.rounds} "
          f"round(s) in turn (the uncached pass can take a minute or more on a CPU) ...", flush=True)
    figures = {"model": f"{args.n_layer}x{args.n_head}x{args.n_embd}, block {args.block_size}",
               "device": rt.describe(), "threads": torch.get_num_threads(), "new_tokens": args.new_tokens,
               "rounds": args.rounds, **bench_sampling(model, rt, args.new_tokens, args.batch, compile, args.rounds,
                                                       say=print)}
    print(f"{figures['model']} on {figures['device']} ({figures['threads']} threads), {args.new_tokens} new characters "
          f"per row, medians of {args.rounds} round(s):")
    for name, rows, cached, compiled in variants_of(args.batch, compile):
        what = f"{rows} row{'s' if rows > 1 else ''}, {'KV cache' if cached else 'full recompute'}" + \
               (", compiled step" if compiled else "")
        print(f"  {what:<36} {figures[f'sample_chars_per_sec_{name}']:9.1f} chars/s")
    print(f"  cache speed-up (1 row)               {figures['sample_cache_speedup']:9.1f}x   "
          f"(same tokens everywhere: {figures['sample_same_tokens']})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
