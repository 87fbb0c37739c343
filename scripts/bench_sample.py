"""python scripts/bench_sample.py: characters/s of generation, one row and a batch, with and without the KV cache,
eager and compiled, in one or more dtypes.

Also the benchmarks' shared timer."""
from __future__ import annotations

import collections
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_prepare import count, figures_parser, write_figures  # noqa: E402
from common.machine import pick_dtype, setup, sync  # noqa: E402
from errors import BooleanFlag, UserError, run_cli  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from model.generate import compiled_step, generate, one_token_step  # noqa: E402


def timed(work, device: torch.device) -> float:
    """Seconds work() took, the device's queue drained before and after."""
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


class Variant(NamedTuple):
    name: str  # the figures' key: sample_chars_per_sec_<name>
    rows: int
    cached: bool
    compiled: bool
    dtype: torch.dtype  # of the weights


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def variants_of(batch: int, compile: bool, dtypes: list[torch.dtype]) -> list[Variant]:
    """Each measurement; the slow uncached one only for one row in the first dtype."""
    out = []
    for dtype in dtypes:
        tag = "" if len(dtypes) == 1 else "_" + dtype_name(dtype)
        out += [Variant("cached" + tag, 1, True, False, dtype)]
        out += [Variant("uncached" + tag, 1, False, False, dtype)] * (dtype == dtypes[0])
        out += [Variant(f"batch{batch}_cached{tag}", batch, True, False, dtype)]
        out += [Variant("compiled" + tag, 1, True, True, dtype),
                Variant(f"batch{batch}_compiled{tag}", batch, True, True, dtype)] * compile
    return out


def bench_sampling(model: GPT, device_type: str, dtypes: list[torch.dtype], new_tokens: int, batch: int = 8,
                   compile: bool = False, rounds: int = 1, say=lambda message: None) -> dict:
    """sample_chars_per_sec_<variant> (median of the rounds), the cache's speed-up, and whether each dtype's
    variants drew the same greedy tokens."""
    model.eval()
    device = model.wte.weight.device
    models = {dtype: model if dtype == model.wte.weight.dtype else copy.deepcopy(model).to(dtype) for dtype in dtypes}
    views = {(dtype, rows): copy.copy(models[dtype]) for dtype in dtypes for rows in (1, batch)}
    for view in views.values():  # caches of its own per shape, made in the warm-up (a CUDA graph reads them)
        view.decode_caches = None
    steps = {(dtype, compiled): compiled_step(device_type) if compiled else one_token_step
             for dtype in dtypes for compiled in {False, compile}}
    variants = variants_of(batch, compile, dtypes)
    seconds = {v.name: [] for v in variants}
    texts = collections.defaultdict(set)

    def run(v: Variant, n: int) -> None:
        texts[v.dtype].add(tuple(generate(views[v.dtype, v.rows], [[0]] * v.rows, n, temperature=0,
                                          use_cache=v.cached, step=steps[v.dtype, v.compiled])[0]))

    for v in variants:  # warm-up
        took = timed(lambda: run(v, 8), device)
        if v.compiled:
            say(f"  compiled the decoding step for {v.rows} row(s), {dtype_name(v.dtype)}, in {took:.1f} s")
    texts.clear()
    for _ in range(rounds):
        for v in variants:
            seconds[v.name].append(timed(lambda: run(v, new_tokens), device))
    speed = {v.name: v.rows * new_tokens / statistics.median(seconds[v.name]) for v in variants}
    out = {f"sample_chars_per_sec_{name}": value for name, value in speed.items()}
    first = variants[0].name  # one row, cached, in the first dtype
    out["sample_cache_speedup"] = speed[first] / speed[variants[1].name]
    for name in map(dtype_name, dtypes[1:]):
        out[f"sample_speedup_{name}"] = speed[f"cached_{name}"] / speed[first]
    out["sample_same_tokens"] = all(len(drawn) == 1 for drawn in texts.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = figures_parser(__doc__)
    for name, default in (("new_tokens", 500), ("n_layer", 6), ("n_head", 6), ("n_embd", 384), ("block_size", 256)):
        parser.add_argument(f"--{name}", type=count if name == "new_tokens" else int, default=default)
    parser.add_argument("--batch", type=count, default=8, help="rows of the batched measurement")
    parser.add_argument("--rounds", type=count, default=3, help="times each variant is timed, in turn")
    parser.add_argument("--compile", action=BooleanFlag, default=None,
                        help="also time a compiled decoding step (default: on CUDA only)")
    parser.add_argument("--device", default="auto", help="auto (a GPU where there is one), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="float32", help="as sample.py's, or several, e.g. float32,bfloat16")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    try:
        cfg = ModelConfig(vocab_size=65, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                          n_embd=args.n_embd)
    except ValueError as err:
        raise UserError(str(err)) from None
    device = setup(args.device, "float32", sampling=True).device
    model = GPT(cfg).to(device)  # random weights: the speed is the same
    params = model.num_params(non_embedding=False)
    dtypes = list(dict.fromkeys(pick_dtype(spec, device, sampling=True, params=params)
                                for spec in args.dtype.split(",")))
    compile = device.type == "cuda" if args.compile is None else args.compile
    variants = variants_of(args.batch, compile, dtypes)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    f = {"model": f"{args.n_layer}x{args.n_head}x{args.n_embd}, block {args.block_size}", "device": where,
         "dtypes": [dtype_name(d) for d in dtypes], "threads": torch.get_num_threads(),
         "new_tokens": args.new_tokens, "rounds": args.rounds}
    print(f"generating {args.new_tokens} characters a row with the {f['model']} model on {where} "
          f"({f['threads']} threads), each variant in turn, {args.rounds} round(s) ...", flush=True)
    f.update(bench_sampling(model, device.type, dtypes, args.new_tokens, args.batch, compile, args.rounds, say=print))
    for v in variants:
        what = f"{v.rows} row{'s' * (v.rows > 1)}, {'KV cache' if v.cached else 'full recompute'}" + \
               ", compiled step" * v.compiled + f", {dtype_name(v.dtype)}"
        print(f"  {what:<46} {f[f'sample_chars_per_sec_{v.name}']:9.1f} chars/s (median)")
    first = dtype_name(dtypes[0])
    print(f"  {f'cache speed-up (1 row, {first})':<46} {f['sample_cache_speedup']:9.1f}x")
    for name in map(dtype_name, dtypes[1:]):
        print(f"  {f'{name} against {first} (1 row, KV cache)':<46} {f['sample_speedup_' + name]:9.2f}x")
    print(f"  every variant of a dtype drew the same tokens: {f['sample_same_tokens']}")
    write_figures(args.json, f)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
