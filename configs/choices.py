"""The choices a run's settings are checked against (optimizers, precisions, compile modes, devices), here so that
configs need nothing from training/, which builds on them."""
from __future__ import annotations

import torch

OPTIMIZERS = ("adamw", "muon")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("blocks", "model")


def valid_device(spec: str) -> bool:
    """auto, cpu, cuda, cuda:N or mps (whether this machine has it is training.runtime.pick_device's question)."""
    if spec == "auto":
        return True
    try:
        return torch.device(spec).type in ("cpu", "cuda", "mps")
    except (RuntimeError, ValueError):
        return False
