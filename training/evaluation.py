"""Scoring a text with a trained model: every character once, by sliding windows of at most block_size characters
whose stride sets how much context each scored character has (scripts/evaluate.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Window:
    begin: int  # inputs are ids[begin:end], targets ids[begin + 1:end + 1]
    end: int
    first_scored: int  # targets before this index were scored by an earlier window


def windows(n_ids: int, block_size: int, stride: int) -> list[Window]:
    """Windows that score each of ids[1:] exactly once (ids[0] has no context to be predicted from).

    stride = block_size: windows side by side, as the full validation of a training run; a smaller stride starts a
    window every stride characters and scores only its last stride targets, each with at least
    block_size - stride characters of context.
    """
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be between 1 and block_size ({block_size}), got {stride}")
    found, begin, scored_to = [], 0, 0  # targets 1..scored_to are scored
    while scored_to < n_ids - 1:
        end = min(begin + block_size, n_ids - 1)
        found.append(Window(begin, end, scored_to + 1))
        scored_to, begin = end, begin + stride
    return found


@torch.inference_mode()
def score(model, ids: torch.Tensor, todo: list[Window], batch_size: int, autocast, progress=None) -> tuple[float, int]:
    """(sum of the cross-entropy over every character the windows score, in nats; how many characters that is)."""
    model.eval()
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for i in range(0, len(todo), batch_size):
        group = todo[i:i + batch_size]
        by_length: dict[int, list[Window]] = {}
        for w in group:  # the last window may be shorter: batch windows of one length together
            by_length.setdefault(w.end - w.begin, []).append(w)
        for length, same in by_length.items():
            x = torch.stack([ids[w.begin:w.end] for w in same]).to(device)
            y = torch.stack([ids[w.begin + 1:w.end + 1] for w in same]).to(device)
            with autocast():
                logits, _ = model(x)
            losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            begin = torch.tensor([w.begin for w in same], device=device)[:, None]
            first = torch.tensor([w.first_scored for w in same], device=device)[:, None]
            keep = begin + 1 + torch.arange(length, device=device) >= first  # (windows, length): targets not yet scored
            total += losses.view(len(same), length)[keep].double().sum()
            count += int(keep.sum())
        if progress is not None:
            progress.update(len(group))
    return total.item(), count
