"""The loop's log line, every log_interval steps: the training loss, learning rate, gradient norm, tokens/s and MFU,
to TensorBoard, the log and the progress bar, from the loop's one read of the device; and the (step, loss) history."""
from __future__ import annotations

import torch
from tqdm import tqdm

from training.clock import TrainClock
from training.nonfinite import NonFiniteWatch
from training.perf import utilisation
from training.report import step_line
from training.session import Session


class StepLog:
    def __init__(self, s: Session, bar: tqdm, clock: TrainClock, watch: NonFiniteWatch, peak_flops: float):
        self.s, self.bar, self.clock, self.watch, self.peak_flops = s, bar, clock, watch, peak_flops
        self.history: list[tuple[int, float]] = []
        last = s.progress.last_eval
        self.last_val = f"val {last['val']:.4f} (saved)" if last else "val -"  # beside the loss on the bar

    def due(self) -> bool:
        it, cfg = self.s.progress.it, self.s.cfg
        return it % cfg.log_interval == 0 or it == cfg.max_iters

    def evaluated(self, it: int, losses: dict[str, float]) -> None:
        self.last_val = f"val {losses['val']:.4f} @{it}"  # the bar says which step the figure is from
        self.bar.set_postfix_str(f"train {losses['train']:.4f} val {losses['val']:.4f}", refresh=False)

    def write(self, lr: float, loss: torch.Tensor, grad_norm: torch.Tensor) -> int:
        """Log this step. Returns the longest run of skipped (non-finite) steps since the last log line: the loop
        judges it."""
        s, it = self.s, self.s.progress.it
        # the only host sync of the loop (and the evaluations'): one read for all three numbers
        loss_value, norm_value, skipped = torch.stack([loss.float(), grad_norm.float(),
                                                       self.watch.longest.float()]).tolist()
        self.watch.looked()
        step_seconds = self.clock.step_seconds()
        tokens_per_sec = s.run.tokens_per_iter / step_seconds
        # MFU is each process's share (the peak is one device's): tokens_per_iter counts every process's tokens
        mfu = utilisation(s.run.flops_per_token * tokens_per_sec / s.d.world_size, self.peak_flops)
        self.history.append((it, loss_value))
        s.log.scalars(it, {"loss/train": loss_value, "optim/lr": lr, "optim/grad_norm": norm_value,
                           "perf/tokens_per_sec": tokens_per_sec, "perf/tokens_seen": it * s.run.tokens_per_iter,
                           "perf/mfu": mfu * 100})  # a percentage, as the console shows it
        s.log.line(step_line(it, s.cfg, loss_value, step_seconds, tokens_per_sec, mfu))
        self.bar.set_postfix_str(f"loss {loss_value:.4f} lr {lr:.2e} {tokens_per_sec:,.0f} tok/s {self.last_val}",
                                 refresh=False)
        return int(skipped)
