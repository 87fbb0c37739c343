"""Measuring a model's loss: a run's quick estimate (fixed random batches of each split) and its full validation (every
non-overlapping validation window), both stoppable between batches; and scoring any text, every character once, by
sliding windows whose stride sets how much context each scored character has (scripts/evaluate.py); and the rule
for when a run evaluates."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from configs import TrainConfig
from data.loader import send
from training.device import Dist, Runtime


def evaluation_due(it: int, cfg: TrainConfig) -> bool:
    """A run evaluates (and saves its checkpoints) every eval_interval steps and at its last step."""
    return it % cfg.eval_interval == 0 or it == cfg.max_iters


def next_evaluation(it: int, cfg: TrainConfig) -> int:
    """The first step from it on at which a run evaluates, by evaluation_due's rule."""
    due = -(-it // cfg.eval_interval) * cfg.eval_interval  # the first multiple of eval_interval from it on
    return min(due, cfg.max_iters) if it <= cfg.max_iters else due


def evaluations_left(it: int, cfg: TrainConfig) -> int:
    """How many evaluations a run at step it has still to make, by evaluation_due's rule (that at step it included)."""
    if it > cfg.max_iters:
        return 0
    every = cfg.eval_interval
    return cfg.max_iters // every - -(-it // every) + 1 + (cfg.max_iters % every != 0)


def plateaued(evals_since_best: int, patience: int) -> bool:
    """--patience: the last `patience` evaluations in a row did not beat the best validation loss (0: never)."""
    return patience > 0 and evals_since_best >= patience


def overfitting(evaluations: list, window: int = 3, margin: float = 0.02) -> bool:
    """Over the last `window` evaluations, each (step, train loss, validation loss), the validation loss rose (to more
    than `margin` above the run's lowest) while the training loss fell: the model learns its training text by heart,
    not what carries over to new text. (Every evaluation reads the same batches, so the rise is the model's.)"""
    if len(evaluations) < window:
        return False
    first, last = evaluations[-window], evaluations[-1]
    best = min(point[2] for point in evaluations)
    return last[2] > first[2] and last[2] > best * (1 + margin) and last[1] < first[1]


def began_overfitting(evaluations: list) -> bool:
    """overfitting() holds now, at the latest evaluation, and held at no earlier one of the run: said once a run."""
    return overfitting(evaluations) and not any(overfitting(evaluations[:n]) for n in range(len(evaluations)))


def asked_to_stop(stop: Callable[[], bool] | None, d: Dist, device: torch.device, batch: int) -> bool:
    """Between evaluation batches; under DDP the ranks agree every 10 batches (a collective), so all stop together."""
    if stop is None:
        return False
    if not d.enabled:
        return stop()
    return batch % 10 == 0 and d.any(stop(), device)


@torch.inference_mode()
def evaluate(model, batches, rt: Runtime, eval_iters: int, d: Dist = Dist(),
             stop: Callable[[], bool] | None = None, progress=None) -> dict[str, float] | None:
    """Mean loss per character over eval_iters x batch_size random windows of each split (a quick estimate): the
    same windows at every evaluation of a run, and whatever the number of processes, which share them out
    (Batches.fixed_batches). Where the validation split has no more windows than that (a small corpus, or long
    batches), its figure is exact instead: the full validation, which then reads fewer windows than the estimate."""
    model.eval()
    out = {}
    try:
        for split in ("train", "val"):
            if split == "val" and batches.val_fits(eval_iters):
                out["val"] = full_validation_loss(model, batches, rt, d, stop, progress)
            else:
                out[split] = mean_loss(model, batches.fixed_batches(split, eval_iters), rt, d, stop, progress)
            if out[split] is None:
                return None
    finally:
        model.train()
    return out


@torch.inference_mode()
def full_validation_loss(model, batches, rt: Runtime, d: Dist = Dist(),
                         stop: Callable[[], bool] | None = None, progress=None) -> float | None:
    """The exact mean loss over every non-overlapping validation window (shared out among the ranks)."""
    model.eval()
    try:
        return mean_loss(model, batches.val_windows(), rt, d, stop, progress)
    finally:
        model.train()


def mean_loss(model, windows, rt: Runtime, d: Dist, stop: Callable[[], bool] | None, progress) -> float | None:
    """The mean loss per character over batches of (x, y) windows, over every rank: each batch's loss weighted by the
    targets it scores (padding rows, targets -1, score none), summed over the batches and then over the ranks, with
    one read of the device at the end. None when a stop request came between batches."""
    total = torch.zeros(2, device=rt.device, dtype=torch.float64)  # (sum of losses, number of characters)
    for batch, (x, y) in enumerate(windows):
        if asked_to_stop(stop, d, rt.device, batch):
            return None
        with rt.autocast():
            loss = model(x, y)[1]  # the mean over the targets that are not -1
        scored = (y >= 0).sum().double()  # all padding (a rank with fewer windows): its loss is 0/0, counted as 0
        total += torch.stack([torch.where(scored > 0, loss.double() * scored, 0.0), scored])
        if progress is not None:
            progress.update(1)
    total = d.sum(total)
    return (total[0] / total[1]).item()


@dataclass(frozen=True)
class Windows:
    """Windows that score each of ids[1:] exactly once (ids[0] has no context to be predicted from), computed a batch
    at a time: window k begins at k x stride and ends block_size later (or at the text's end); its inputs are
    ids[begin:end], its targets ids[begin + 1:end + 1], and it scores the targets after the previous window's end.
    Nothing is kept per window, so scoring a text of a billion characters at stride 1 costs no more memory than one.

    stride = block_size: windows side by side, as the full validation of a training run; a smaller stride starts a
    window every stride characters and scores only its last stride targets, each with at least block_size - stride
    characters of context."""
    n_ids: int
    block_size: int
    stride: int

    def __post_init__(self) -> None:
        if not 1 <= self.stride <= self.block_size:
            raise ValueError(f"stride must be between 1 and block_size ({self.block_size}), got {self.stride}")

    def __len__(self) -> int:
        if self.n_ids < 2:
            return 0
        return max(0, -(-(self.n_ids - 1 - self.block_size) // self.stride)) + 1  # the first to reach the end is last

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(begin, end, first scored target) of windows first .. first + count - 1, each an int64 tensor."""
        k = torch.arange(first, min(first + count, len(self)), dtype=torch.int64)
        end = (k * self.stride + self.block_size).clamp(max=self.n_ids - 1)
        before = ((k - 1) * self.stride + self.block_size).clamp(max=self.n_ids - 1)  # the previous window's end
        return k * self.stride, end, torch.where(k == 0, 1, before + 1)

    def by_length(self, first: int, count: int) -> list[tuple[int, slice]]:
        """Windows first .. first + count - 1 grouped by length, as (length, their rows of batch()): every window is
        block_size long but the text's last, which may end sooner, at the text's end. Arithmetic on the host: nothing
        is read from a tensor."""
        rows = min(first + count, len(self)) - first
        last = first + rows - 1
        last_length = min(last * self.stride + self.block_size, self.n_ids - 1) - last * self.stride
        if last_length == self.block_size:
            return [(self.block_size, slice(0, rows))]
        return [(self.block_size, slice(0, rows - 1))] * (rows > 1) + [(last_length, slice(rows - 1, rows))]


@torch.inference_mode()
def score(model, ids: torch.Tensor, todo: Windows, batch_size: int, autocast, progress=None) -> tuple[float, int]:
    """(sum of the cross-entropy over every character the windows score, in nats; how many characters that is). The
    device is read once, at the end: the batches' shapes are the windows' arithmetic, and the windows score every
    character but the first exactly once, so the count is known without counting."""
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for first in range(0, len(todo), batch_size):
        begins, _, firsts = todo.batch(first, batch_size)
        for length, rows in todo.by_length(first, batch_size):
            begin = begins[rows]
            offsets = torch.arange(length + 1)
            tokens = send(ids[begin[:, None] + offsets].long(), device)  # (windows, length + 1)
            x, y = tokens[:, :-1], tokens[:, 1:]
            scored_from = send(firsts[rows] - begin - 1, device)  # each window's first unscored target, as a column
            with autocast():
                logits, _ = model(x)
            losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            keep = torch.arange(length, device=device) >= scored_from[:, None]  # (windows, length)
            total += torch.where(keep, losses.view(-1, length).double(), 0.0).sum()
        if progress is not None:
            progress.update(len(begins))
    return total.item(), max(todo.n_ids - 1, 0)
