"""The optimizer factory: AdamW with weight decay on matrices only."""
from __future__ import annotations

import torch
import torch.nn as nn


def configure_optimizer(model: nn.Module, learning_rate: float, weight_decay: float,
                        betas: tuple[float, float], device_type: str) -> torch.optim.AdamW:
    """AdamW; weights of 2 or more dimensions decay, biases and LayerNorm gains do not.

    The fused implementation (one kernel for all parameters) on CUDA and CPU: on a 2-core CPU it made a whole
    training step of the 4x4x128 model about 13% faster (38.0/35.0 ms vs 43.4/40.5 ms, interleaved runs)."""
    params = [p for p in model.parameters() if p.requires_grad]  # parameters() lists a tied weight once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))
