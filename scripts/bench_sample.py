"""python scripts/bench_sample.py: characters/s of generation with and without the KV cache (6x6x384, block 256)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench import bench_sampling  # noqa: E402
from model import GPT, ModelConfig  # noqa: E402
from training import runtime  # noqa: E402


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
    rt = runtime.setup(args.device, "float32")
    model = GPT(cfg).to(rt.device)  # random weights: speed does not depend on what the model learned
    print(f"generating {args.new_tokens} characters twice with a {args.n_layer}x{args.n_head}x{args.n_embd} model on "
          f"{rt.describe()}, with and without the KV cache (the uncached pass can take a minute or more on a CPU) ...",
          flush=True)
    figures = {"model": f"{args.n_layer}x{args.n_head}x{args.n_embd}, block {args.block_size}",
               "device": rt.describe(), "threads": torch.get_num_threads(), "new_tokens": args.new_tokens,
               **bench_sampling(model, rt, args.new_tokens)}
    print(f"{figures['model']} on {figures['device']} ({figures['threads']} threads), {args.new_tokens} new characters:")
    print(f"  with KV cache    {figures['sample_chars_per_sec_cached']:8.1f} chars/s")
    print(f"  full recompute   {figures['sample_chars_per_sec_uncached']:8.1f} chars/s")
    print(f"  speed-up         {figures['sample_cache_speedup']:8.1f}x   (same tokens: {figures['sample_same_tokens']})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
