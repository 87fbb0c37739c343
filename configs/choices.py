"""Every setting's allowed values. The model's own (attention, positions, activations) live in model/config.py, and
attention_score's in model/scoring.py's FORMS."""
from __future__ import annotations

import torch

OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "wsd")
DDP_CHOICES = ("auto", "always")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
MUON_DTYPES = ("auto", "float32", "bfloat16")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# torch.compile's modes that replay CUDA graphs: a replay overwrites outputs the loop still holds, so training refuses
# them until a GPU shows them correct.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
COMPILE_SCOPES = ("blocks", "model")


def valid_device(spec: str) -> bool:
    """auto, cpu, cuda, cuda:N or mps (whether this machine has it: common.machine.pick_device)."""
    if spec == "auto":
        return True
    try:
        return torch.device(spec).type in ("cpu", "cuda", "mps")
    except (RuntimeError, ValueError):
        return False
