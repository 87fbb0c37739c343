"""Measuring a model's loss: when to evaluate, the estimate, the full validation, and scoring any text."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from common.machine import Runtime
from configs import TrainConfig
from data.loader import Windows, send
from training.device import Dist


def next_evaluation(it: int, cfg: TrainConfig) -> int:
    """The first step from it on that evaluates (every eval_interval, and at max_iters)."""
    due = -(-it // cfg.eval_interval) * cfg.eval_interval  # rounded up
    return min(due, cfg.max_iters) if it <= cfg.max_iters else due


def evaluations_left(it: int, cfg: TrainConfig) -> int:
    """The evaluations left to a run at step it, that at it included."""
    if it > cfg.max_iters:
        return 0
    every = cfg.eval_interval
    return cfg.max_iters // every - -(-it // every) + 1 + (cfg.max_iters % every != 0)


def plateaued(evals_since_best: int, patience: int) -> bool:
    """--patience: `patience` evaluations in a row did not beat the best (0: never)."""
    return patience > 0 and evals_since_best >= patience


def overfitting(evaluations: list, window: int = 3, margin: float = 0.02) -> bool:
    """Over the last `window` (step, train, val), val rose past (1 + margin) x its lowest while train fell."""
    if len(evaluations) < window:
        return False
    first, last = evaluations[-window], evaluations[-1]
    best = min(point[2] for point in evaluations)
    return last[2] > first[2] and last[2] > best * (1 + margin) and last[1] < first[1]


def began_overfitting(evaluations: list) -> bool:
    return overfitting(evaluations) and not any(overfitting(evaluations[:n]) for n in range(len(evaluations)))


def asked_to_stop(stop: Callable[[], bool] | None, d: Dist, device: torch.device, batch: int) -> bool:
    """Between evaluation batches; under DDP the ranks agree every 10 batches."""
    if stop is None:
        return False
    if not d.enabled:
        return stop()
    return batch % 10 == 0 and d.any(stop(), device)


@torch.inference_mode()
def evaluate(model, batches, rt: Runtime, eval_iters: int, d: Dist = Dist(),
             stop: Callable[[], bool] | None = None, progress=None) -> dict[str, float] | None:
    """{"train", "val"}: the mean loss over eval_iters fixed batches of each; None if a stop came."""
    model.eval()
    out = {}
    try:
        for split in ("train", "val"):
            full = split == "val" and batches.val_fits(eval_iters)
            windows = batches.val_windows() if full else batches.fixed_batches(split, eval_iters)
            out[split] = mean_loss(model, windows, rt, d, stop, progress)
            if out[split] is None:
                return None
    finally:
        model.train()
    return out


@torch.inference_mode()
def full_validation_loss(model, batches, rt: Runtime, d: Dist = Dist(),
                         stop: Callable[[], bool] | None = None, progress=None) -> float | None:
    """The mean loss over every validation window, shared among the ranks."""
    model.eval()
    try:
        return mean_loss(model, batches.val_windows(), rt, d, stop, progress)
    finally:
        model.train()


def mean_loss(model, windows, rt: Runtime, d: Dist, stop: Callable[[], bool] | None, progress) -> float | None:
    """The mean loss per scored character over every rank's batches; None if a stop came."""
    total = torch.zeros(2, device=rt.device, dtype=torch.float64)  # (sum of losses, number of characters)
    for batch, (x, y) in enumerate(windows):
        if asked_to_stop(stop, d, rt.device, batch):
            return None
        with rt.autocast():
            loss = model(x, y)[1]
        scored = (y >= 0).sum().double()  # all padding: its loss is 0/0, counted as 0
        total += torch.stack([torch.where(scored > 0, loss.double() * scored, 0.0), scored])
        if progress is not None:
            progress.update(1)
    total = d.sum(total)
    return (total[0] / total[1]).item()


@torch.inference_mode()
def score(model, ids: torch.Tensor, todo: Windows, batch_size: int, autocast, progress=None) -> tuple[float, int]:
    """(the summed cross-entropy in nats of the characters the windows score, their count)."""
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
            scored_from = send(firsts[rows] - begin - 1, device)  # each window's first scored target
            with autocast():
                logits, _ = model(x)
            losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            keep = torch.arange(length, device=device) >= scored_from[:, None]  # (windows, length)
            total += torch.where(keep, losses.view(-1, length).double(), 0.0).sum()
        if progress is not None:
            progress.update(len(begins))
    return total.item(), max(todo.n_ids - 1, 0)
