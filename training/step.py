"""One training step: forward and backward over the micro-batches, clipping, and an optimizer step that skips
non-finite gradients, all without waiting for the device."""
from __future__ import annotations

import contextlib

import torch

from configs import TrainConfig
from training import runtime
from training.stop import StopRequest


class StepAbandoned(Exception):
    """A stop request came between the micro-batches of a step: the step is undone (no weight changed, the batch and
    dropout streams back where the step began), so the run saves the state before it and resumes exactly."""


def train_step(model, optimizer, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig, lr: float,
               stop: StopRequest | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over grad_accum_steps micro-batches: (loss, grad norm, whether the gradients were finite),
    all three on the device, so that the step itself never waits for it. stop (one process only: under DDP the ranks
    would have to agree): a request between micro-batches abandons the step (StepAbandoned)."""
    if getattr(model, "backward_unchecked", False):  # compiled, and its backward not compiled yet
        loss = first_compiled_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    else:
        loss = forward_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    grad_norm, finite = update(model, optimizer, scaler, rt, cfg, lr)
    if scaler.is_enabled():  # float16: gradients that overflow are the scaler's search for a scale (the step is
        finite = torch.isfinite(loss)  # skipped, the scale lowered); a loss that is not finite is the run going wrong
    return loss, grad_norm, finite


def forward_backward(model, optimizer, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig,
                     stop: StopRequest | None = None) -> torch.Tensor:
    """The gradients of grad_accum_steps micro-batches, accumulated in .grad; returns their mean loss (on the device)."""
    loss_sum = torch.zeros((), device=rt.device)
    # Where the step began (a few KB), so that a stop between micro-batches can undo it: a step of many micro-batches
    # can take minutes, and a stop must not wait for it.
    began = (batches.state_dict(), random_states(rt)) if stop is not None and cfg.grad_accum_steps > 1 else None
    for micro in range(cfg.grad_accum_steps):
        if began is not None and micro > 0 and stop.requested:
            batches.load_state_dict(began[0])
            set_random_states(rt, began[1])
            optimizer.zero_grad(set_to_none=True)
            raise StepAbandoned
        x, y = batches.get_batch("train")
        # Under DDP, gradients are averaged across ranks once, on the last micro-batch, not on every one.
        last = micro == cfg.grad_accum_steps - 1
        with (model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()):
            with rt.autocast():
                loss = model(x, y)[1] / cfg.grad_accum_steps
            scaler.scale(loss).backward()
        loss_sum += loss.detach().float()
    return loss_sum


def first_compiled_backward(model, optimizer, scaler, batches, rt: runtime.Runtime, cfg: TrainConfig,
                            stop: StopRequest | None) -> torch.Tensor:
    """forward_backward through a compiled model (training.compiling.CompileFallback) whose backward is compiled at
    this first .backward(): if compiling it fails, compilation is turned off (with the warning) and the step is
    computed again, uncompiled, from where it began: the same batches, the same dropout."""
    began = batches.state_dict(), random_states(rt)
    try:
        loss = forward_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    except StepAbandoned:
        raise
    except Exception as err:
        if not model.fall_back(err):
            raise
        batches.load_state_dict(began[0])
        set_random_states(rt, began[1])
        optimizer.zero_grad(set_to_none=True)
        return forward_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    model.backward_done = True
    return loss


def random_states(rt: runtime.Runtime) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(rt.device) if rt.device_type == "cuda" else None


def set_random_states(rt: runtime.Runtime, states: tuple) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], rt.device)


def update(model, optimizer, scaler, rt: runtime.Runtime, cfg: TrainConfig,
           lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip the gradients and step the optimizer at learning rate lr, then clear the gradients: (grad norm, whether
    the gradients were finite), on the device.

    A step whose gradients are not finite is skipped, so NaN never reaches the weights. With float16 the gradients
    are first divided by the loss scale, and the scaler then lowers its scale after such a step (which unscale_
    recorded) or raises it after a run of good ones; the step itself is skipped here as in every precision, on the
    device (the scaler's own step() reads its flag on the host for any optimizer but fused AdamW, Muon included)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    scaler.unscale_(optimizer)  # (nothing without float16)
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")  # inf: measure the norm, clip nothing
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    finite = torch.isfinite(grad_norm)  # a gradient that is not finite anywhere makes the norm inf or NaN
    optimizer.step_if_finite(finite, on_device=rt.device_type != "cpu")  # a CPU reads the flag for free
    if scaler.is_enabled():
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite
