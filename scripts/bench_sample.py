"""python scripts/bench_sample.py: characters/s of generation with and without the KV cache (6x6x384, block 256)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from model import GPT, ModelConfig  # noqa: E402
from model.generate import generate  # noqa: E402


def chars_per_second(model: GPT, prompt: list[int], new_tokens: int, use_cache: bool) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = generate(model, [prompt], new_tokens, temperature=0, use_cache=use_cache)[0]
    return new_tokens / (time.perf_counter() - start), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("--new_tokens", type=int, default=500)
    parser.add_argument("--n_layer", type=int, default=6)
    parser.add_argument("--n_head", type=int, default=6)
    parser.add_argument("--n_embd", type=int, default=384)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=65, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                      n_embd=args.n_embd)
    model = GPT(cfg).to(args.device).eval()
    prompt = [0]
    generate(model, [prompt], 20, temperature=0)  # warm-up
    cached, out_cached = chars_per_second(model, prompt, args.new_tokens, use_cache=True)
    uncached, out_uncached = chars_per_second(model, prompt, args.new_tokens, use_cache=False)
    figures = {"model": f"{args.n_layer}x{args.n_head}x{args.n_embd}, block {args.block_size}",
               "device": args.device, "threads": torch.get_num_threads(), "new_tokens": args.new_tokens,
               "chars_per_sec_cached": cached, "chars_per_sec_uncached": uncached, "speedup": cached / uncached,
               "same_tokens": out_cached == out_uncached}
    print(f"{figures['model']} on {args.device} ({figures['threads']} threads), {args.new_tokens} new characters:")
    print(f"  with KV cache    {cached:8.1f} chars/s")
    print(f"  full recompute   {uncached:8.1f} chars/s")
    print(f"  speed-up         {cached / uncached:8.1f}x   (same tokens: {figures['same_tokens']})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
