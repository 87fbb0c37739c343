"""Performance figures: model FLOPs per token, a measured peak matmul rate, MFU, and how many operations a piece of
code dispatches (on a GPU, outside a compiled graph, each is a kernel launch)."""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model.config import ModelConfig


def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention's 12·L·C·T (the usual estimate)."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def utilisation(achieved_flops: float, peak_flops: float) -> float:
    """MFU: achieved over peak FLOP/s, at most 1 (a step faster than the measured peak means the peak was measured
    low on a busy machine, not that the step beat the hardware)."""
    return min(1.0, achieved_flops / peak_flops)


class CountOperations(TorchDispatchMode):
    """Inside `with CountOperations() as ops:`, ops.count is the number of tensor operations run that compute or
    copy (views of existing tensors and the profiler's markers, which launch nothing, are not counted): in eager
    PyTorch on a GPU, about one kernel launch each, whose host-side cost a small model's step can be made of."""

    LAUNCH_NOTHING = frozenset({"_unsafe_view", "_record_function_enter_new", "_record_function_exit"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not (func.is_view or func.overloadpacket.__name__ in self.LAUNCH_NOTHING)
        return func(*args, **(kwargs or {}))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def model_matmul_shape(batch_size: int, cfg: ModelConfig) -> tuple[int, int, int]:
    """(m, k, n) of the model's largest matrix product: the feed-forward's first layer over a micro-batch."""
    return batch_size * cfg.block_size, cfg.n_embd, 4 * cfg.n_embd


def measure_peak_flops(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]] = (),
                       seconds: float = 0.03, trials: int = 3) -> float:
    """The best FLOP/s of matrix products in the training dtype on this device: a large square one and the given
    (m, k, n) shapes (the model's own), each the best of several short trials, so that a busy moment on a shared machine
    does not lower the ceiling (a ceiling measured in a busy moment would give MFUs above 100%). Every run pays for it
    before its first step: with the CPU default's shapes on a 2-core AMD EPYC, trials of 0.1 s took 0.63-0.64 s and found
    399.5-413.2 GFLOP/s, trials of 0.03 s 0.21-0.22 s and 399.2-413.1 (4 rounds in turn)."""
    size = 8192 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG (dropout, resume) untouched
    best = 0.0
    for m, k, n in [(size, size, size), *shapes]:
        a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
        b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
        sync(device)
        start = time.perf_counter()
        a @ b  # warm-up
        sync(device)
        if time.perf_counter() - start >= seconds:  # one product takes longer than a trial (bfloat16 emulated on a
            best = max(best, 2 * m * k * n / (time.perf_counter() - start))  # CPU without bfloat16 units: 2.3 s)
            continue
        a @ b
        for _ in range(trials):
            sync(device)
            reps, start = 0, time.perf_counter()
            while True:
                a @ b
                reps += 1
                if reps % 4 == 0 or device.type == "cpu":  # a GPU is read every few products, a CPU after each
                    sync(device)
                    elapsed = time.perf_counter() - start
                    if elapsed >= seconds:
                        break
            best = max(best, 2 * m * k * n * reps / elapsed)
    return best
