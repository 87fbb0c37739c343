"""Rotary position embeddings (RoPE): rotate q and k by angles that grow with position, instead of a position table."""
from __future__ import annotations

import torch


def rope_tables(block_size: int, head_size: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, each (block_size, head_size): dimension i and i + head_size/2
    form a pair that turns by the same angle, so each half repeats the other's frequencies."""
    frequencies = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[i], x[i + head_size/2]) of x (..., head_size) by its position's angle.

    cos, sin broadcast against x and hold each token's row of the tables. A rotation keeps lengths, and the
    dot product of a rotated q and k depends only on the distance between their positions.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
