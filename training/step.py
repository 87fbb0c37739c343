"""One training step and what decides it: the learning-rate schedule (a linear warm-up, then a cosine or
warm-up-stable-decay fall to min_lr); forward and backward over the micro-batches, clipping, and an optimizer step
that skips non-finite gradients, all without waiting for the device; and the watch on skipped steps."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable

import torch

from configs import TrainConfig
from errors import in_one_line
from training.device import Dist, Runtime


# ---- the learning-rate schedule --------------------------------------------------------------------------------------
def get_lr(it: int, cfg: TrainConfig) -> float:
    """Linear warm-up to learning_rate, then down to min_lr at lr_decay_iters (default: max_iters): along a cosine,
    or (wsd) flat until the last warmdown_fraction of the way, then in a straight line."""
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
    """A note when the run ends inside its warm-up: its learning rate only rises and never decays ("" otherwise)."""
    if not it < cfg.max_iters <= cfg.warmup_iters:
        return ""
    last = get_lr(cfg.max_iters - 1, cfg)
    return (f"note: --warmup_iters {cfg.warmup_iters} is not shorter than --max_iters {cfg.max_iters}, so the learning "
            f"rate only rises (to {last:.2g} at the last step, of --learning_rate {cfg.learning_rate:g}) and never "
            f"decays; give a shorter warm-up, e.g. --warmup_iters {max(1, cfg.max_iters // 10)}")

# ---- the step --------------------------------------------------------------------------------------------------------
class StepAbandoned(Exception):
    """A stop request came between the micro-batches of a step: the step is undone (no weight changed, the batch and
    dropout streams back where the step began), so the run saves the state before it and resumes exactly."""


def train_step(model, optimizer, scaler, batches, rt: Runtime, cfg: TrainConfig, lr: float,
               stop: Callable[[], bool] | None = None,
               d: Dist = Dist()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over grad_accum_steps micro-batches: (loss, grad norm, whether the gradients were finite),
    all three on the device, so that the step itself never waits for it. stop() says whether a stop was asked for (one
    process only: under DDP the ranks would have to agree): one between micro-batches abandons the step
    (StepAbandoned). d: the ranks, when model is wrapped in DDP."""
    if getattr(model, "backward_unchecked", False):  # compiled, and its backward not compiled yet
        loss = first_compiled_backward(model, optimizer, scaler, batches, rt, cfg, stop, d)
    else:
        loss = forward_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    searching = scaler.is_enabled() and scaler._get_scale_async() > 1  # (before update() lowers it; on the device)
    grad_norm, finite = update(model, optimizer, scaler, rt, cfg, lr)
    if scaler.is_enabled():
        # float16: gradients that overflow are the scaler's search for a scale (the step is skipped, the scale halved),
        # which is over once the scale is down to 1: gradients that overflow float16 unscaled are the run going wrong,
        # as a loss that is not finite is. Those steps count (a run whose every step overflows stops).
        finite = torch.isfinite(loss) & (finite | searching)
    return loss, grad_norm, finite


def forward_backward(model, optimizer, scaler, batches, rt: Runtime, cfg: TrainConfig,
                     stop: Callable[[], bool] | None = None) -> torch.Tensor:
    """The gradients of grad_accum_steps micro-batches, accumulated in .grad; returns their mean loss, on the device."""
    loss_sum = torch.zeros((), device=rt.device)
    # Where the step began (a few KB), so that a stop between micro-batches can undo it: a step of many micro-batches
    # can take minutes, and a stop must not wait for it.
    began = (batches.state_dict(), random_states(rt)) if stop is not None and cfg.grad_accum_steps > 1 else None
    for micro in range(cfg.grad_accum_steps):
        if began is not None and micro > 0 and stop():
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


def first_compiled_backward(model, optimizer, scaler, batches, rt: Runtime, cfg: TrainConfig,
                            stop: Callable[[], bool] | None, d: Dist = Dist()) -> torch.Tensor:
    """forward_backward through a compiled model (training.device.CompileFallback) whose backward is compiled at
    this first .backward(): if compiling it fails, compilation is turned off (with the warning) and the step is
    computed again, uncompiled, from where it began: the same batches, the same dropout.

    Under DDP the ranks agree: if any rank's compilation failed, every rank turns it off and computes the step again,
    so their collectives stay matched. The step runs under no_sync and its gradients are averaged by hand afterwards:
    DDP's hooks would have started reducing the gradients computed before the failure, and its next forward would
    refuse to start before that reduction finished."""
    began = batches.state_dict(), random_states(rt)
    loss, failure = attempt(model, optimizer, scaler, batches, rt, cfg, stop, d)
    failure = d.first(failure)  # (under DDP: any rank's)
    if failure is None:
        model.backward_done = True
    else:
        batches.load_state_dict(began[0])
        set_random_states(rt, began[1])
        optimizer.zero_grad(set_to_none=True)
        model.give_up(failure)
        with model.no_sync() if d.enabled else contextlib.nullcontext():
            loss = forward_backward(model, optimizer, scaler, batches, rt, cfg, stop)
    d.average([p.grad for p in model.parameters() if p.grad is not None])  # (under DDP)
    return loss


def attempt(model, optimizer, scaler, batches, rt: Runtime, cfg: TrainConfig, stop: Callable[[], bool] | None,
            d: Dist) -> tuple[torch.Tensor | None, str | None]:
    """The step through the compiled model (under DDP, no_sync): (its loss, None), or (None, the compiler's failure
    in one line); the run's own errors are raised. Once this returns, nothing of a failed attempt is held: its
    traceback, and with it the activations it saved for its backward, are gone before the step is computed again."""
    try:
        with model.no_sync() if d.enabled else contextlib.nullcontext():
            return forward_backward(model, optimizer, scaler, batches, rt, cfg, stop), None
    except StepAbandoned:
        raise
    except Exception as err:
        if not model.compilers(err):
            raise
        return None, (f"rank {d.rank}: {in_one_line(err)}" if d.world_size > 1 else in_one_line(err))


def random_states(rt: Runtime) -> tuple:
    return torch.get_rng_state(), torch.cuda.get_rng_state(rt.device) if rt.device_type == "cuda" else None


def set_random_states(rt: Runtime, states: tuple) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], rt.device)


def update(model, optimizer, scaler, rt: Runtime, cfg: TrainConfig,
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


# ---- the watch on skipped steps --------------------------------------------------------------------------------------
class NonFiniteWatch:
    """Steps whose loss or gradients were not finite, counted on the device and read only where the loop reads the
    device anyway (the log line), so the watch never makes a step wait."""

    def __init__(self, device: torch.device):
        self.streak = torch.zeros((), dtype=torch.long, device=device)  # skipped steps in a row, still going on
        self.longest = torch.zeros((), dtype=torch.long, device=device)  # the longest such run since the last look

    def update(self, finite: torch.Tensor) -> None:
        self.streak = (self.streak + 1) * ~finite
        self.longest = torch.maximum(self.longest, self.streak)

    def looked(self) -> None:
        """The longest run was read: from now on it counts from the run still going on."""
        self.longest = self.streak


def too_many_nonfinite(it: int, cfg: TrainConfig, last: Path) -> str:
    """The one line for a run that met max_nonfinite_steps skipped steps in a row; last: its last good checkpoint."""
    return (f"stopped at step {it}: {cfg.max_nonfinite_steps} steps in a row had a non-finite loss or gradient (they "
            f"were skipped); the last good checkpoint is {last}; try a lower --learning_rate or --dtype float32, "
            f"then --resume")
