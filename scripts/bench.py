"""python scripts/bench.py [--config NAME] [--device D] [--json FILE]: training, sampling and data speed, with MFU."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import train  # noqa: E402
from configs import load_config  # noqa: E402
from data import Batches, default_cache_dir, prepare, resolve  # noqa: E402
from errors import UserError, run_cli  # noqa: E402
from model import GPT  # noqa: E402
from model.generate import generate  # noqa: E402
from model.optim import configure_optimizer  # noqa: E402
from training import runtime  # noqa: E402
from training.perf import flops_per_token, measure_peak_flops, sync  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prepare import make_corpus  # noqa: E402


def bench_training(cfg, rt, iters: int, warmup: int) -> dict:
    cache_dir = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    prepared = prepare(resolve(cfg.data, cache_dir), cache_dir, cfg.val_fraction, cfg.encoding, cfg.encoding_errors)
    batches = Batches(prepared, cfg.block_size, cfg.batch_size, rt.device, cfg.seed)  # the real loader
    torch.manual_seed(cfg.seed)
    model_cfg = cfg.model_config(prepared.tokenizer.vocab_size)
    model = GPT(model_cfg).to(rt.device)
    optimizer = configure_optimizer(model, cfg.learning_rate, cfg.weight_decay, (cfg.beta1, cfg.beta2),
                                    rt.device_type, cfg.optimizer)
    scaler = rt.grad_scaler()
    step_model = runtime.maybe_compile(model, cfg.compile, rt.device_type)
    for _ in range(warmup):  # compilation, allocator and cache warm-up
        train.train_step(step_model, optimizer, scaler, batches, rt, cfg, cfg.learning_rate)
    sync(rt.device)
    start = time.perf_counter()
    for _ in range(iters):
        train.train_step(step_model, optimizer, scaler, batches, rt, cfg, cfg.learning_rate)
    sync(rt.device)
    seconds = (time.perf_counter() - start) / iters
    tokens = cfg.batch_size * cfg.block_size * cfg.grad_accum_steps
    n_params = model.num_params(non_embedding=False)
    return {"model": model, "params": n_params, "ms_per_iter": seconds * 1000, "tokens_per_iter": tokens,
            "tokens_per_sec": tokens / seconds, "flops_per_token": flops_per_token(n_params, model_cfg)}


def bench_sampling(model: GPT, rt, new_tokens: int) -> dict:
    model.eval()
    out, texts = {}, {}
    for name, use_cache in (("cached", True), ("uncached", False)):
        with rt.autocast():
            generate(model, [[0]], 8, temperature=0, use_cache=use_cache)  # warm-up
            sync(rt.device)
            start = time.perf_counter()
            texts[name] = generate(model, [[0]], new_tokens, temperature=0, use_cache=use_cache)
            sync(rt.device)
        out[f"sample_chars_per_sec_{name}"] = new_tokens / (time.perf_counter() - start)
    out["sample_cache_speedup"] = out["sample_chars_per_sec_cached"] / out["sample_chars_per_sec_uncached"]
    out["sample_same_tokens"] = texts["cached"] == texts["uncached"]
    return out


def bench_prepare(megabytes: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        make_corpus(corpus, megabytes)
        start = time.perf_counter()
        prepare(resolve(str(corpus), Path(tmp)), Path(tmp))
        return corpus.stat().st_size / 1e6 / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark a config on this device (any train.py --field works too).")
    parser.add_argument("--json", default="", help="also write the figures to this JSON file")
    parser.add_argument("--iters", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps first")
    parser.add_argument("--sample_tokens", type=int, default=500, help="characters generated per sampling measurement")
    parser.add_argument("--prepare_mb", type=int, default=50, help="size of the generated corpus for the prepare speed")
    args, rest = parser.parse_known_args(argv)
    cfg, note, _ = load_config(rest, torch.cuda.is_available())
    rt = runtime.setup(cfg.device, cfg.dtype, cfg.num_threads)
    if args.iters < 1 or args.sample_tokens < 1 or args.prepare_mb < 1:
        raise UserError("--iters, --sample_tokens and --prepare_mb must be at least 1")
    figures = {"config": cfg.config_name, "device": rt.describe(), "threads": torch.get_num_threads(),
               "optimizer": cfg.optimizer}
    trained = bench_training(cfg, rt, args.iters, args.warmup)
    model = trained.pop("model")
    figures.update(trained)
    figures["achieved_flops"] = figures["flops_per_token"] * figures["tokens_per_sec"]
    figures["peak_flops"] = measure_peak_flops(rt.device, rt.dtype)
    figures["mfu"] = figures["achieved_flops"] / figures["peak_flops"]
    sample_rt = runtime.for_sampling(rt, cfg.dtype)
    figures.update(bench_sampling(model, sample_rt, args.sample_tokens))
    figures["sample_dtype"] = str(sample_rt.dtype).removeprefix("torch.")
    figures["prepare_mb_per_sec"] = bench_prepare(args.prepare_mb)

    print(note)
    rows = [("device", figures["device"] + f" ({figures['threads']} threads)"),
            ("model", f"{figures['params'] / 1e6:.2f}M parameters, {cfg.n_layer}x{cfg.n_head}x{cfg.n_embd}, "
                      f"block {cfg.block_size}, batch {cfg.batch_size}, {cfg.optimizer}"),
            ("train step", f"{figures['ms_per_iter']:.1f} ms/iter, {figures['tokens_per_sec']:,.0f} tokens/s"),
            ("model FLOPs", f"{figures['flops_per_token'] / 1e6:.2f} MFLOP/token -> "
                            f"{figures['achieved_flops'] / 1e9:.1f} GFLOP/s"),
            ("peak (matmul)", f"{figures['peak_flops'] / 1e9:.1f} GFLOP/s in {str(rt.dtype).removeprefix('torch.')}"),
            ("MFU", f"{figures['mfu'] * 100:.1f}%"),
            ("sampling", f"{figures['sample_chars_per_sec_cached']:,.0f} chars/s with KV cache, "
                         f"{figures['sample_chars_per_sec_uncached']:,.0f} without "
                         f"({figures['sample_cache_speedup']:.1f}x), {figures['sample_dtype']}"),
            ("data prepare", f"{figures['prepare_mb_per_sec']:.1f} MB/s")]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
