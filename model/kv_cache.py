"""The decoding state GPT.forward takes while sampling: a key/value cache of fixed size per layer, written at the
slots of the tokens being read, and the left padding of each row, from which the model derives positions and masks."""
from __future__ import annotations

from dataclasses import dataclass

import torch


class LayerCache:
    """One layer's keys and values: (B, n_head, capacity, head_size), allocated once. A call writes its keys and values
    at its tokens' slots and attends over the whole capacity, with a mask that hides the slots not yet reached; so
    every decoding step has the same shapes (a GPU kernel is planned once, a compiled step never recompiles). Eager on
    a CPU, in_use trims attention to the slots filled so far instead."""

    def __init__(self, batch_size: int, n_head: int, capacity: int, head_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (batch_size, n_head, capacity, head_size)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        # On a CPU, where a new shape costs nothing, attention may read only the slots in use (None: all of them, the
        # fixed shapes a GPU and a compiled step need). Reading 256 slots instead of the ~190 in use made sampling the
        # 6x6x384 model 12% slower on a 2-core CPU.
        self.in_use: int | None = None
        if self.keys.device.type == "cuda":  # a CUDA graph may replay a step that writes these: the same address always
            # (guard=False: caches of another shape, which replace these, re-record the graph instead of recompiling;
            # generate() reuses a model's caches while the shape stays, see model/generate.py's model_caches)
            torch._dynamo.mark_static_address(self.keys, guard=False)
            torch._dynamo.mark_static_address(self.values, guard=False)

    @property
    def capacity(self) -> int:
        return self.keys.size(2)

    @property
    def n_keys(self) -> int:
        """How many slots attention reads: all of them, or those in use."""
        return self.capacity if self.in_use is None else self.in_use

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's (B, n_head, T, head_size) keys and values at slots (T,); return the n_keys first slots.
        (With in_use, this call's slots are the last T of them, and a plain slice writes them: cheaper on a CPU.)"""
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
    """What sampling passes to GPT.forward (keyword decoding=).

    caches: one LayerCache per layer, or None to read the whole window at every step.
    input_pos: (T,) the slots of this call's tokens in the caches, on the device (with caches; a prefill reads slots
    0..T-1, a decoding step one slot). Positions and the mask are derived from it, on the device.
    pad: (B,) how many slots on the left of each row are padding (prompts of different lengths), or None when no
    row is padded. A padded row then computes exactly what it would alone.
    """

    caches: list[LayerCache] | None = None
    input_pos: torch.Tensor | None = None
    pad: torch.Tensor | None = None

    @classmethod
    def cached(cls, n_layer: int, batch_size: int, n_head: int, capacity: int, head_size: int,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "Decoding":
        return cls([LayerCache(batch_size, n_head, capacity, head_size, device, dtype) for _ in range(n_layer)])
