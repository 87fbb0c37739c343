"""python scripts/bench_sample.py: characters/s of generation: one stream and a batch, with and without the KV cache,
eager and compiled, in one or more dtypes, timed in turn."""
from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common.machine import pick_dtype, setup, sync  # noqa: E402
from common.run_folder import write_text_atomic  # noqa: E402
from errors import ArgumentParser, BooleanFlag, UserError, run_cli  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from model.generate import compiled_step, generate, one_token_step  # noqa: E402


class Variant(NamedTuple):
    name: str  # the figures' key: sample_chars_per_sec_<name>
    rows: int
    cached: bool
    compiled: bool
    dtype: torch.dtype  # of the weights


def variants_of(batch: int, compile: bool, dtypes: list[torch.dtype]) -> list[Variant]:
    """Each measurement; the slow uncached one only for one stream in the first dtype."""
    out = []
    for dtype in dtypes:
        tag = "" if len(dtypes) == 1 else "_" + dtype_name(dtype)
        out += [Variant("cached" + tag, 1, True, False, dtype)]
        if dtype == dtypes[0]:
            out += [Variant("uncached" + tag, 1, False, False, dtype)]
        out += [Variant(f"batch{batch}_cached{tag}", batch, True, False, dtype)]
        if compile:
            out += [Variant("compiled" + tag, 1, True, True, dtype),
                    Variant(f"batch{batch}_compiled{tag}", batch, True, True, dtype)]
    return out


def own_caches(model: GPT) -> GPT:
    """The model with decoding caches of its own."""
    view = copy.copy(model)
    view.decode_caches = None
    return view


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bench_sampling(model: GPT, device_type: str, dtypes: list[torch.dtype], new_tokens: int, batch: int = 8,
                   compile: bool = False, rounds: int = 1, say=lambda message: None) -> dict:
    """sample_chars_per_sec_<variant> (the median of the rounds), the cache's speed-up, and whether every variant of
    a dtype drew the same greedy tokens. Weights are cast to each dtype, as sample.py does."""
    model.eval()
    models = {dtype: model if dtype == model.wte.weight.dtype else copy.deepcopy(model).to(dtype) for dtype in dtypes}
    # a view per shape, so that its caches (and a CUDA graph reading them) are made once, in the warm-up
    views = {(dtype, rows): own_caches(models[dtype]) for dtype in dtypes for rows in (1, batch)}
    steps = {(dtype, False): one_token_step for dtype in dtypes}
    if compile:
        steps.update({(dtype, True): compiled_step(device_type) for dtype in dtypes})
    variants = variants_of(batch, compile, dtypes)
    seconds = {v.name: [] for v in variants}
    texts = {dtype: set() for dtype in dtypes}  # the greedy texts each dtype's variants drew

    def run(v: Variant, n: int) -> list[int]:
        return generate(views[v.dtype, v.rows], [[0]] * v.rows, n, temperature=0, use_cache=v.cached,
                        step=steps[v.dtype, v.compiled])[0]

    for v in variants:  # warm-up
        start = time.perf_counter()
        run(v, 8)
        sync(model.wte.weight.device)
        if v.compiled:
            say(f"  compiled the decoding step for {v.rows} row(s), {dtype_name(v.dtype)}, in "
                f"{time.perf_counter() - start:.1f} s")
    for _ in range(rounds):
        for v in variants:
            sync(model.wte.weight.device)
            start = time.perf_counter()
            texts[v.dtype].add(tuple(run(v, new_tokens)))
            sync(model.wte.weight.device)
            seconds[v.name].append(time.perf_counter() - start)
    out = {f"sample_chars_per_sec_{v.name}": v.rows * new_tokens / statistics.median(seconds[v.name])
           for v in variants}
    first, uncached = variants[0], variants[1]
    speed = {v.name: out[f"sample_chars_per_sec_{v.name}"] for v in variants}
    out["sample_cache_speedup"] = speed[first.name] / speed[uncached.name]
    for v in variants:  # each dtype's one-stream cached speed against the first dtype's
        if v.rows == 1 and v.cached and not v.compiled and v.dtype != first.dtype:
            out[f"sample_speedup_{dtype_name(v.dtype)}"] = speed[v.name] / speed[first.name]
    out["sample_same_tokens"] = all(len(drawn) == 1 for drawn in texts.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--new_tokens", type=int, default=500)
    parser.add_argument("--n_layer", type=int, default=6)
    parser.add_argument("--n_head", type=int, default=6)
    parser.add_argument("--n_embd", type=int, default=384)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="rows of the batched measurement")
    parser.add_argument("--rounds", type=int, default=3, help="times each variant is timed, in turn")
    parser.add_argument("--compile", action=BooleanFlag, default=None,
                        help="also time a compiled decoding step (default: on CUDA only)")
    parser.add_argument("--device", default="auto", help="auto (a GPU where there is one), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="float32",
                        help="the weights' dtype, as sample.py's, or several, e.g. float32,bfloat16")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if min(args.new_tokens, args.batch, args.rounds) < 1:
        raise UserError("--new_tokens, --batch and --rounds must be at least 1")
    torch.manual_seed(0)
    try:
        cfg = ModelConfig(vocab_size=65, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                          n_embd=args.n_embd)
    except ValueError as err:
        raise UserError(str(err)) from None
    device = setup(args.device, "float32", sampling=True).device  # as sample.py sets it up
    model = GPT(cfg).to(device)  # random weights: the speed is the same
    params = model.num_params(non_embedding=False)
    dtypes = list(dict.fromkeys(pick_dtype(spec, device, sampling=True, params=params)
                                for spec in args.dtype.split(",")))
    compile = device.type == "cuda" if args.compile is None else args.compile
    variants = variants_of(args.batch, compile, dtypes)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(f"generating {args.new_tokens} characters with a {args.n_layer}x{args.n_head}x{args.n_embd} model on "
          f"{where}: {', '.join(v.name for v in variants)}, {args.rounds} round(s) in turn (the uncached pass can "
          f"take a minute or more on a CPU) ...", flush=True)
    figures = {"model": f"{args.n_layer}x{args.n_head}x{args.n_embd}, block {args.block_size}", "device": where,
               "dtypes": [dtype_name(d) for d in dtypes], "threads": torch.get_num_threads(),
               "new_tokens": args.new_tokens, "rounds": args.rounds,
               **bench_sampling(model, device.type, dtypes, args.new_tokens, args.batch, compile, args.rounds,
                                say=print)}
    print(f"{figures['model']} on {where} ({figures['threads']} threads), {args.new_tokens} new characters per row, "
          f"medians of {args.rounds} round(s):")
    for v in variants:
        what = f"{v.rows} row{'s' if v.rows > 1 else ''}, {'KV cache' if v.cached else 'full recompute'}" + \
               (", compiled step" if v.compiled else "") + f", {dtype_name(v.dtype)}"
        print(f"  {what:<46} {figures[f'sample_chars_per_sec_{v.name}']:9.1f} chars/s")
    print(f"  {'cache speed-up (1 row, ' + dtype_name(dtypes[0]) + ')':<46} {figures['sample_cache_speedup']:9.1f}x")
    for dtype in dtypes[1:]:
        print(f"  {dtype_name(dtype) + ' against ' + dtype_name(dtypes[0]) + ' (1 row, KV cache)':<46} "
              f"{figures['sample_speedup_' + dtype_name(dtype)]:9.2f}x")
    print(f"  every variant of a dtype drew the same tokens: {figures['sample_same_tokens']}")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(figures, indent=1) + "\n", "the figures file", "--json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
