"""On a CPU, before the first step: whether one step fits in memory, and how long the run will take (from one timed
forward and backward pass), with a note before a long one starts."""
from __future__ import annotations

import os
import time

import torch

from configs import TrainConfig
from errors import UserError
from training.build import Progress, Run
from training.runtime import Runtime, free_memory
from training.log import Log
from training.perf import sync
from training.report import out_of_memory


SLOW_RUN_SECONDS = 600  # on a CPU, a run expected to take longer than this says so before it starts
GPU_PRESETS = ("shakespeare_char", "shakespeare_char_gpu")


# The memory one training step's activations take on a CPU, in bytes per batch_size x block_size x n_embd x n_layer:
# what a forward and backward added to the peak resident memory (rotary positions, fused attention) on a 2-core AMD
# EPYC, for 16 x 1024 x 160 x 2, 8 x 256 x 384 x 6 and 32 x 256 x 384 x 6: under bfloat16 autocast 80.3, 78.1 and
# 77.5; in float32 108.9, 105.7 and 101.4.
ACTIVATION_BYTES = {torch.bfloat16: 80, torch.float32: 110}
# The explicit attention path (--attention explicit, and the additive form, which has no fused kernel) also keeps each
# layer's attention weights, batch_size x n_head x block_size²: 2.8-3.6 bytes each beyond the figures above,
# measured the same way (16 x 512 x 160 x 2, 8 x 1024 x 160 x 2, 4 x 1024 x 128 x 4), so 4.
WEIGHT_BYTES = 4
PARAMETER_BYTES = 16  # a float32 weight, its gradient and two optimizer moments (AdamW; Muon keeps one)


def refuse_if_too_big(cfg: TrainConfig, rt: Runtime, saved: str) -> None:
    """On a CPU, a run whose model and training step need more memory than the machine has free is refused before
    it is tried: there the system ends the process when memory runs out (exit 137, "Killed"), and no error reaches
    Python to name the fix (on a GPU it does: see report.out_of_memory). Every process of the machine needs its own.
    The blocks' weights are 12 x n_layer x n_embd² (the embeddings are left out: small beside them)."""
    free = free_memory() if rt.device_type == "cpu" else None
    layers = max(cfg.n_layer, 1)
    activation_bytes = ACTIVATION_BYTES.get(rt.dtype, ACTIVATION_BYTES[torch.float32])
    need = (activation_bytes * cfg.batch_size * cfg.block_size * cfg.n_embd * layers
            + PARAMETER_BYTES * 12 * cfg.n_layer * cfg.n_embd ** 2)
    if cfg.attention == "explicit" or cfg.attention_score == "additive":
        need += WEIGHT_BYTES * cfg.batch_size * cfg.n_head * cfg.block_size ** 2 * cfg.n_layer
    need *= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun: the processes on this machine
    if free is not None and need > free:
        figures = f" (it would need about {need / 2**30:.1f} GiB; this machine has {free / 2**30:.1f} GiB free)"
        raise UserError(out_of_memory(cfg, saved, figures))


def expected_seconds(run: Run, progress: Progress) -> tuple[float, float]:
    """(seconds per training step, seconds for the rest of the run) on this device, from one timed forward and
    backward pass on the first validation batch. In eval mode, so no dropout mask is drawn: the run's random streams
    and weights stay exactly as they were."""
    cfg, rt = run.cfg, run.rt
    x, y = next(run.batches.val_windows())
    run.model.eval()
    for _ in range(2):  # the first pass warms up
        start = time.perf_counter()
        with rt.autocast():
            loss = run.model(x, y)[1]
        loss.backward()
        sync(rt.device)
        pass_seconds = time.perf_counter() - start
    run.model.zero_grad(set_to_none=True)
    run.model.train()
    step = pass_seconds * cfg.grad_accum_steps  # validation batches are full size (the last one padded)
    steps_left = cfg.max_iters - progress.it
    evaluations = steps_left // cfg.eval_interval + 1
    forward = step / 3 / cfg.grad_accum_steps  # a forward pass of one batch is about a third of a training step
    val_batches = run.batches.num_val_batches()
    per_evaluation = cfg.eval_iters + min(cfg.eval_iters, val_batches)  # a split that fits is read whole, once
    return step, steps_left * step + (evaluations * per_evaluation + (val_batches if cfg.full_val else 0)) * forward


def warn_if_slow(run: Run, progress: Progress, log: Log) -> None:
    """A run that will take long on a CPU says so at once, with the figure and a preset made for a CPU."""
    if run.rt.device_type != "cpu" or progress.it >= run.cfg.max_iters:
        return
    step, total = expected_seconds(run, progress)
    if total < SLOW_RUN_SECONDS:
        return
    name = run.cfg.config_name
    made_for = f"{name} is made for a GPU; " if name in GPU_PRESETS else ""
    about = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.0f} min"
    log.say(f"note: {made_for}on this CPU this run would take about {about} ({step * 1000:.0f} ms per step "
            f"x {run.cfg.max_iters - progress.it} steps, plus evaluations); for a run of a minute or two use "
            f"--config shakespeare_char_cpu, or lower --max_iters and --eval_iters")
