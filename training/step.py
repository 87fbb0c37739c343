"""One training step: forward and backward over the micro-batches, clipping, and an optimizer step that skips
non-finite gradients, all without waiting for the device."""
from __future__ import annotations

import contextlib

import torch

from configs import TrainConfig
from training import runtime


def train_step(model, optimizer, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig,
               lr: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over grad_accum_steps micro-batches: (loss, grad norm, whether the gradients were finite),
    all three on the device, so that the step itself never waits for it."""
    loss = forward_backward(model, scaler, batches, rt, cfg)
    grad_norm, finite = update(model, optimizer, scaler, rt, cfg, lr)
    return loss, grad_norm, finite


def forward_backward(model, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig) -> torch.Tensor:
    """The gradients of grad_accum_steps micro-batches, accumulated in .grad; returns their mean loss (on the device)."""
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum_steps):
        x, y = batches.get_batch("train")
        # Under DDP, gradients are averaged across ranks once, on the last micro-batch, not on every one.
        last = micro == cfg.grad_accum_steps - 1
        with (model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()):
            with rt.autocast():
                loss = model(x, y)[1] / cfg.grad_accum_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach().float()
    return loss_sum


def update(model, optimizer, scaler, rt: runtime.Runtime, cfg: TrainConfig,
           lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradients and step the optimizer at learning rate lr, then clear the gradients: (grad norm, whether
    the gradients were finite), on the device.

    A step whose gradients are not finite is skipped, so NaN never reaches the weights (with float16 the
    gradient scaler does this itself, and lowers its scale)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    scaler.unscale_(optimizer)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")  # inf: measure the norm, clip nothing
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scaler.is_enabled():  # float16: the scaler finds inf/NaN itself, skips such a step and lowers its scale
        scaler.step(optimizer)
        scaler.update()
        finite = torch.ones((), dtype=torch.bool, device=rt.device)
    else:
        finite = torch.isfinite(grad_norm)
        optimizer.step_if_finite(finite, on_device=rt.device_type != "cpu")  # a CPU reads the flag for free
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite
