"""The learning-rate schedule and the optimizers (AdamW, or Muon plus AdamW), which skip non-finite steps."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from common.machine import native_bfloat16
from configs import TrainConfig


# ---- the learning-rate schedule --------------------------------------------------------------------------------------
def get_lr(it: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then to min_lr at lr_decay_iters: a cosine, or (wsd) flat then a line at the end."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if it >= decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    if cfg.lr_schedule == "wsd":
        fall = max(0.0, (progress - (1 - cfg.warmdown_fraction)) / cfg.warmdown_fraction)  # progress < 1 here
        return cfg.learning_rate - fall * (cfg.learning_rate - cfg.min_lr)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def warmup_note(cfg: TrainConfig, it: int) -> str:
    if not it < cfg.max_iters <= cfg.warmup_iters:
        return ""
    return (f"note: --warmup_iters {cfg.warmup_iters} is not shorter than --max_iters {cfg.max_iters}, so the learning "
            f"rate only rises, to {get_lr(cfg.max_iters - 1, cfg):.2g}. Give a shorter warm-up, e.g. --warmup_iters "
            f"{max(1, cfg.max_iters // 10)}")


# ---- the optimizers --------------------------------------------------------------------------------------------------
def configure_optimizer(model: nn.Module, learning_rate: float, weight_decay: float,
                        betas: tuple[float, float], device_type: str, kind: str = "adamw", muon_dtype: str = "auto"):
    """AdamW, decaying matrices only; "muon": the blocks' matrices go to Muon."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]  # a tied weight is listed once
    hidden = [p for name, p in named if kind == "muon" and name.startswith("blocks.") and p.dim() == 2]
    rest = [p for _, p in named if all(p is not h for h in hidden)]
    decay = [p for p in rest if p.dim() >= 2]
    no_decay = [p for p in rest if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    adamw = AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))
    if kind == "adamw" or not hidden:  # no blocks (n_layer 0): nothing for Muon
        return adamw
    if muon_dtype == "auto":  # Newton-Schulz in bfloat16 where it is native
        muon_dtype = "bfloat16" if native_bfloat16(device_type) else "float32"
    muon = Muon(hidden, lr=learning_rate, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw",
                ns_dtype=getattr(torch, muon_dtype))
    return MuonAndAdamW(muon, adamw)


class Muon(torch.optim.Muon):
    """torch.optim.Muon with a Newton-Schulz dtype; matrices of one shape updated together."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype  # not saved: a resume elsewhere takes that machine's

    @torch.no_grad()
    def step(self, finite: torch.Tensor | None = None) -> None:
        """One Muon step; given finite (0-d bool), kept or dropped on the device."""
        for group in self.param_groups:
            same_shape: dict[torch.Size, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if "momentum_buffer" not in self.state[p]:  # torch.optim.Muon's state key
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                same_shape.setdefault(p.shape, []).append(p)
            for shape, matrices in same_shape.items():
                self._update(group, matrices, muon_step_size(group["lr"], group["adjust_lr_fn"], shape), finite)

    def _update(self, group: dict, params: list, step_size: float, finite: torch.Tensor | None) -> None:
        """Matrices of one shape stepped as stacks; given finite, kept only where it is True."""
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        grad, buffer, param = torch.stack([p.grad for p in params]), torch.stack(buffers), torch.stack(params)
        if finite is not None:
            grad = torch.where(finite, grad, 0.0)  # no NaN into the arithmetic
        momentum = group["momentum"]
        new_buffer = buffer.lerp(grad, 1 - momentum)  # momentum: an exponential average of gradients
        update = grad.lerp(new_buffer, momentum) if group["nesterov"] else new_buffer  # a step ahead
        direction = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
        new_param = torch.add(param * (1 - group["lr"] * group["weight_decay"]), direction, alpha=-step_size)
        if finite is not None:
            new_buffer, new_param = torch.where(finite, new_buffer, buffer), torch.where(finite, new_param, param)
        torch._foreach_copy_(buffers, new_buffer.unbind())
        torch._foreach_copy_(params, new_param.unbind())


def muon_step_size(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning rate for a (rows, columns) matrix."""
    rows, columns = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, rows / columns))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * (0.2 * math.sqrt(max(rows, columns)))
    return lr


def orthogonalize(matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """Newton-Schulz iterations pushing every singular value towards 1 (about U·Vᵀ)."""
    a, b, c = coefficients
    x = matrix.to(dtype).reshape(-1, *matrix.shape[-2:])  # (n, rows, columns); nothing below writes into it
    tall = matrix.size(-2) > matrix.size(-1)
    if tall:
        x = x.mT  # the wide orientation: the smaller Gram matrix
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a·x + (b·G + c·G²)·x
    return (x.mT if tall else x).reshape(matrix.shape)


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW that skips a step whose gradients are not finite."""

    def step_if_finite(self, finite: torch.Tensor, on_device: bool = True) -> None:
        """step(), or nothing when finite is False; a fused kernel reads the flag on the device (found_inf)."""
        if self.defaults.get("fused"):
            self.found_inf = (~finite).float()
            try:
                self.step()
            finally:
                del self.found_inf
        elif bool(finite):
            self.step()


class MuonAndAdamW:
    """Two optimizers stepped as one."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw
        self.param_groups = muon.param_groups + adamw.param_groups  # the schedule sets their lr

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def step_if_finite(self, finite: torch.Tensor, on_device: bool = True) -> None:
        """Both steps or neither; on_device: the host never reads the flag."""
        if on_device:
            self.muon.step(finite)
            self.adamw.step_if_finite(finite)
        elif bool(finite):
            self.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups  # loading made new group dicts
