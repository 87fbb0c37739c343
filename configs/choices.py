"""Every setting's allowed values; the model's own are in model/config.py and model/scoring.py."""
from __future__ import annotations

import torch

OPTIMIZERS = ("adamw", "muon")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
CHOICES = {"optimizer": OPTIMIZERS, "lr_schedule": ("cosine", "wsd"), "ddp": ("auto", "always"),
           "dtype": ("auto", *DTYPE_NAMES), "muon_dtype": ("auto", "float32", "bfloat16"),
           "compile": ("auto", "true", "false"), "compile_mode": ("default", "max-autotune-no-cudagraphs"),
           "compile_scope": ("blocks", "model"), "encoding_errors": ("strict", "replace", "ignore")}
# torch.compile's modes that replay CUDA graphs: a replay overwrites outputs the loop still holds.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def valid_device(spec: str) -> bool:
    """auto, cpu, cuda, cuda:N or mps (whether this machine has it: common.machine.pick_device)."""
    try:
        return spec == "auto" or torch.device(spec).type in ("cpu", "cuda", "mps")
    except (RuntimeError, ValueError):
        return False
