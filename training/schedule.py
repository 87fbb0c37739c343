"""The learning-rate schedule: a linear warm-up, then a cosine (or warm-up-stable-decay) fall to min_lr."""
from __future__ import annotations

import math

from configs import TrainConfig


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
