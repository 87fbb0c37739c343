"""KVCache: the keys and values of positions already seen, so decoding computes each token once."""
from __future__ import annotations

import torch


class KVCache:
    """Preallocated (n_layer, B, n_head, capacity, head_size) keys and values, filled left to right.

    Each layer's attention calls update() with its new keys/values; the model calls advance() once
    all layers have seen the step, so every layer writes at the same slots.
    """

    def __init__(self, n_layer: int, batch_size: int, n_head: int, capacity: int, head_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (n_layer, batch_size, n_head, capacity, head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0  # slots filled so far

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.size(2)
        if end > self.capacity:
            raise ValueError(f"KV cache holds {self.capacity} positions; cannot grow to {end}")
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.length += n

    def reset(self) -> None:
        self.length = 0
