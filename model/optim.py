"""The optimizer factory: AdamW with weight decay on matrices only, or Muon for the hidden matrices plus AdamW."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from training.runtime import cpu_has_bfloat16_units

OPTIMIZERS = ("adamw", "muon")


def configure_optimizer(model: nn.Module, learning_rate: float, weight_decay: float,
                        betas: tuple[float, float], device_type: str, kind: str = "adamw"):
    """AdamW; weights of 2 or more dimensions decay, biases and LayerNorm gains do not.

    The fused implementation (one kernel for all parameters) on CUDA and CPU: on a 2-core CPU it made a whole
    training step of the 4x4x128 model about 13% faster (38.0/35.0 ms vs 43.4/40.5 ms, interleaved runs).

    kind "muon": the weight matrices inside the blocks go to torch.optim.Muon (momentum, then orthogonalised by
    Newton-Schulz iterations), with its learning rate scaled to match AdamW's update size, so the same
    learning_rate and schedule serve both; embeddings, biases and norms stay with AdamW."""
    fused = device_type in ("cuda", "cpu")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]  # a tied weight is listed once
    hidden = [p for name, p in named if kind == "muon" and name.startswith("blocks.") and p.dim() == 2]
    rest = [p for _, p in named if all(p is not h for h in hidden)]
    decay = [p for p in rest if p.dim() >= 2]
    no_decay = [p for p in rest if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)
    if kind == "adamw":
        return adamw
    muon = Muon(hidden, lr=learning_rate, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw",
                ns_dtype=newton_schulz_dtype(device_type))
    return MuonAndAdamW(muon, adamw)


def newton_schulz_dtype(device_type: str) -> torch.dtype:
    """bfloat16, as torch.optim.Muon does, except on a CPU without bfloat16 units: there PyTorch emulates bfloat16
    products, and with the matrix units capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 on a Zen 4) a Muon step of the 2x160
    model took 515 ms in bfloat16 against 23 ms in float32."""
    if device_type == "cpu" and not cpu_has_bfloat16_units():
        return torch.float32
    return torch.bfloat16


class Muon(torch.optim.Muon):
    """torch.optim.Muon with a choice of dtype for its Newton-Schulz iterations. In bfloat16 it computes exactly what
    torch.optim.Muon computes (the tests check it bit for bit); float32 is for CPUs without bfloat16 units."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype  # not a group setting: a checkpoint resumed on another machine takes that machine's

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            lr, momentum = group["lr"], group["momentum"]
            for param, grad, buffer in zip(params, grads, buffers):
                buffer.lerp_(grad, 1 - momentum)  # momentum: an exponential average of gradients
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                scale = 0.2 * math.sqrt(max(param.shape)) if group["adjust_lr_fn"] == "match_rms_adamw" \
                    else math.sqrt(max(1, param.size(0) / param.size(1)))
                param.mul_(1 - lr * group["weight_decay"])
                param.add_(update, alpha=-lr * scale)


def orthogonalize(matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Newton-Schulz iterations that push every singular value of the matrix towards 1 (about U·Vᵀ of its SVD)."""
    a, b, c = coefficients
    x = matrix.to(dtype, copy=True)  # never the caller's tensor: it is divided in place below
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T  # iterate on the wide orientation: the Gram matrix x·xᵀ is the smaller one
    x.div_(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a·x + (b·G + c·G²)·x
    return x.T if tall else x


def step_if_finite(optimizer, finite: torch.Tensor) -> None:
    """optimizer.step(), or nothing at all when the 0-d bool tensor finite is False: weights, moments and step counts
    stay exactly as they were.

    Fused AdamW takes the flag as a tensor (as torch.amp.GradScaler hands it over) and skips inside its kernel, so the
    host never waits for the device. torch.optim.Muon has no such input: with Muon the host reads the flag, one sync
    per step (free on a CPU; on a GPU the host stops queueing work until the step is done)."""
    if isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults.get("fused"):
        optimizer.found_inf = (~finite).float()
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif bool(finite):
        optimizer.step()


class MuonAndAdamW:
    """Two optimizers stepped as one: what train.py needs of an optimizer (param_groups for the learning-rate
    schedule, step, zero_grad, state_dict / load_state_dict for checkpoints)."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
