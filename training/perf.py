"""Performance figures: model FLOPs per token, a measured peak matmul rate, and MFU."""
from __future__ import annotations

import time

import torch

from model.config import ModelConfig


def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention's 12·L·C·T (the usual estimate)."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None, seconds: float = 0.3) -> float:
    """FLOP/s of a large square matmul in the training dtype on this device: the honest ceiling for MFU."""
    size = size or (8192 if device.type == "cuda" else 1024)
    gen = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG (dropout, resume) untouched
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    for _ in range(2):
        a @ b  # warm-up
    sync(device)
    reps, start = 0, time.perf_counter()
    while True:
        a @ b
        reps += 1
        if reps % 4 == 0:
            sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return 2 * size**3 * reps / elapsed
