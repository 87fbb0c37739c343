"""Every setting's allowed values, in one place: the model's (attention, positions, activation), the run's
(optimizers, schedules, precisions, compile modes, devices, DDP). model/config.py and configs/schema.py check against
them; common/ and training/ build on them. One exception: attention_score's values are the names of
model/scoring.py's FORMS, where each form is declared once with what it computes."""
from __future__ import annotations

import torch

# the model
ATTENTION_IMPLS = ("auto", "sdpa", "explicit")
POSITIONS = ("learned", "rope", "none")
ACTIVATIONS = ("gelu", "relu2")
# the run
OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "wsd")
DDP_CHOICES = ("auto", "always")
DTYPE_NAMES = ("float32", "bfloat16", "float16")
MUON_DTYPES = ("auto", "float32", "bfloat16")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# torch.compile's modes that replay CUDA graphs. A replay overwrites the previous replay's outputs, and the loop keeps
# each step's loss on the device until it logs, per-block compilation feeds one block's output to the next graph, and
# the step-0 evaluation runs under inference_mode before any backward: none of it is measured on a GPU, so training
# refuses them until one is (the sampler's compiled decoding step uses CUDA graphs by itself, see model/generate.py).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
COMPILE_SCOPES = ("blocks", "model")


def valid_device(spec: str) -> bool:
    """auto, cpu, cuda, cuda:N or mps (whether this machine has it is common.machine.pick_device's question)."""
    if spec == "auto":
        return True
    try:
        return torch.device(spec).type in ("cpu", "cuda", "mps")
    except (RuntimeError, ValueError):
        return False
