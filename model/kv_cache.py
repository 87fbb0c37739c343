"""The decoding state GPT.forward takes while sampling: a key/value cache per layer and each row's left padding."""
from __future__ import annotations

from dataclasses import dataclass

import torch


class LayerCache:
    """One layer's keys and values, (B, n_head, capacity, head_size), allocated once."""

    def __init__(self, batch_size: int, n_head: int, capacity: int, head_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (batch_size, n_head, capacity, head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.in_use: int | None = None  # slots read (None: all, the fixed shapes a GPU needs)
        if self.keys.device.type == "cuda":  # a CUDA graph replays writes here: keep the address
            torch._dynamo.mark_static_address(self.keys, guard=False)
            torch._dynamo.mark_static_address(self.values, guard=False)

    @property
    def capacity(self) -> int:
        return self.keys.size(2)

    @property
    def n_keys(self) -> int:
        """How many slots attention reads: all, or those in use."""
        return self.capacity if self.in_use is None else self.in_use

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (B, n_head, T, head_size) keys and values at slots (T,); return the n_keys first."""
        if self.in_use is None:
            self.keys.index_copy_(2, slots, k.to(self.keys.dtype))
            self.values.index_copy_(2, slots, v.to(self.values.dtype))
            return self.keys, self.values
        first = self.in_use - k.size(2)
        self.keys[:, :, first:self.in_use] = k
        self.values[:, :, first:self.in_use] = v
        return self.keys[:, :, :self.in_use], self.values[:, :, :self.in_use]


@dataclass
class Decoding:
    """What sampling passes to GPT.forward: caches, input_pos (T,) slots, pad (B,) or None."""

    caches: list[LayerCache] | None = None
    input_pos: torch.Tensor | None = None
    pad: torch.Tensor | None = None

    @classmethod
    def cached(cls, n_layer: int, batch_size: int, n_head: int, capacity: int, head_size: int,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "Decoding":
        return cls([LayerCache(batch_size, n_head, capacity, head_size, device, dtype) for _ in range(n_layer)])
