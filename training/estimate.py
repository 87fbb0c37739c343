"""On a CPU, before the first step: whether one step fits in memory, and how long the run will take (from one timed
forward and backward pass), with a note before a long one starts."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

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
CPU_PRESET = "shakespeare_char_cpu"  # the preset a slow run on a CPU suggests


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


@dataclass
class Estimate:
    """Where a CPU run's time would go, in seconds."""
    step: float  # one training step
    steps: float  # the steps left
    evaluations: float  # the evaluations left (estimates of both splits, or the validation split read whole)
    full_validation: float  # the final one, over every validation window (0 with --full_val false)

    @property
    def total(self) -> float:
        return self.steps + self.evaluations + self.full_validation


PROBE_SECONDS = 2.0  # a timed pass of one window longer than this: the run is slow enough to say so from it alone


def pass_seconds(run: Run, rows: int) -> float:
    """Seconds of a forward and backward pass over `rows` windows of the first validation batch (the second of two:
    the first warms up), in eval mode, so that no dropout mask is drawn and the run's random streams stay as they
    were; with one window only, the warm-up pass is the timed one when it is long already."""
    rt = run.rt
    x, y = (t[:rows] for t in next(run.batches.val_windows()))
    run.model.eval()
    for attempt in range(2):
        start = time.perf_counter()
        with rt.autocast():
            loss = run.model(x, y)[1]
        loss.backward()
        sync(rt.device)
        seconds = time.perf_counter() - start
        if attempt == 0 and seconds * run.cfg.batch_size > PROBE_SECONDS * 10 and rows == 1:
            break  # a step of more than ~20 s: the warm-up pass is figure enough
    run.model.zero_grad(set_to_none=True)
    run.model.train()
    return seconds


def expected_seconds(run: Run, progress: Progress) -> Estimate:
    """Where the rest of the run's time would go on this device, from a timed pass over one window first (which, for
    a model that is slow on this machine, is the estimate: the note then comes within seconds, not after a whole
    step), and otherwise over a whole batch."""
    cfg = run.cfg
    one = pass_seconds(run, 1)
    batch = one * cfg.batch_size if one * cfg.batch_size > PROBE_SECONDS * 10 else pass_seconds(run, cfg.batch_size)
    step = batch * cfg.grad_accum_steps  # validation batches are full size (the last one padded)
    forward = batch / 3  # a forward pass of one batch is about a third of a training step's
    steps_left = cfg.max_iters - progress.it
    evaluations = steps_left // cfg.eval_interval + 1
    val_batches = run.batches.num_val_batches()
    per_evaluation = cfg.eval_iters + min(cfg.eval_iters, val_batches)  # a split that fits is read whole, once
    return Estimate(step, steps_left * step, evaluations * per_evaluation * forward,
                    val_batches * forward if cfg.full_val else 0.0)


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else \
        f"{seconds:.0f} s"


def warn_if_slow(run: Run, progress: Progress, log: Log) -> None:
    """A run that will take long on a CPU says so before its first step: the figure, where the time goes, and the
    flags that cut its largest parts (a preset made for a CPU only where another preset runs)."""
    if run.rt.device_type != "cpu" or progress.it >= run.cfg.max_iters:
        return
    cfg, estimate = run.cfg, expected_seconds(run, progress)
    if estimate.total < SLOW_RUN_SECONDS:
        return
    steps_left = cfg.max_iters - progress.it
    parts = [(estimate.steps, f"{steps_left} steps x {duration(estimate.step)}", "a lower --max_iters"),
             (estimate.evaluations, f"evaluations {duration(estimate.evaluations)}",
              "a lower --eval_iters or a larger --eval_interval"),
             (estimate.full_validation, f"the final full validation {duration(estimate.full_validation)}",
              "--full_val false")]
    parts = [part for part in parts if part[0] > 0]
    fixes = [fix for _, _, fix in sorted(parts, key=lambda part: -part[0])[:2]]  # the two largest costs
    if cfg.config_name != CPU_PRESET:
        fixes.insert(0, f"--config {CPU_PRESET}")
    made_for = f"{cfg.config_name} is made for a GPU; " if cfg.config_name in GPU_PRESETS else ""
    log.say(f"note: {made_for}on this CPU this run would take about {duration(estimate.total)} "
            f"({', '.join(what for _, what, _ in parts)}); for a shorter one: {'; or '.join(fixes)}")
