"""The decoding state GPT.forward takes while sampling: a key/value cache per layer, so each token is computed once,
and the valid lengths of left-padded rows, from which the model derives positions and the attention mask."""
from __future__ import annotations

from dataclasses import dataclass

import torch


class LayerCache:
    """One layer's keys and values of the positions seen so far: (B, n_head, capacity, head_size), filled left to
    right. The layer's attention appends to it; nothing else has to move it on."""

    def __init__(self, batch_size: int, n_head: int, capacity: int, head_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (batch_size, n_head, capacity, head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0  # slots filled so far

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's (B, n_head, T, head_size) keys and values; return every key and value so far."""
        end = self.length + k.size(2)
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; cannot grow to {end}")
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


@dataclass
class Decoding:
    """What sampling passes to GPT.forward (keyword decoding=).

    caches: one LayerCache per layer, or None to read the whole window at every step.
    valid_lens: (B,) real tokens per row when prompts of different lengths are left-padded (the cache included),
    or None when no row is padded.
    """

    caches: list[LayerCache] | None = None
    valid_lens: torch.Tensor | None = None

    @classmethod
    def cached(cls, n_layer: int, batch_size: int, n_head: int, capacity: int, head_size: int,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "Decoding":
        return cls([LayerCache(batch_size, n_head, capacity, head_size, device, dtype) for _ in range(n_layer)])

    @property
    def start(self) -> int:
        """The position of this call's first token: how many the caches hold already."""
        return self.caches[0].length if self.caches else 0

    def reset(self) -> None:
        """Empty the caches (before reading a window again from its start)."""
        for cache in self.caches or ():
            cache.length = 0
