"""Batches of (B, T) token windows from the prepared files, and the sliding Windows that score any text."""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from data.prepare import Prepared, ShortSplit, short_split
from errors import check_type


RESIDENT_MAX_BYTES = 1 << 30  # a corpus up to this is kept on the GPU


def send(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device; to CUDA from pinned memory, without a wait."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def val_window_starts(n_ids: int, block_size: int) -> np.ndarray:
    """Where the full validation's windows begin: side by side, block_size inputs each."""
    return np.arange(0, n_ids - block_size, block_size)


class Batches:
    """x (B, T) token ids and y, shifted by one, from a seeded stream; under DDP a rank's slice of one batch."""

    def __init__(self, prepared: Prepared, block_size: int, batch_size: int, device: torch.device | str,
                 seed: int = 0, rank: int = 0, world_size: int = 1, resident: bool | None = None):
        self.block_size, self.batch_size = block_size, batch_size
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        sizes = {split: prepared.meta[f"n_{split}"] for split in ("train", "val")}
        if (short := short_split(sizes, block_size)) is not None:
            raise ShortSplit(f"{short.problem()}; give --block_size {short.largest} or less, a longer corpus or "
                             f"another --val_fraction", short)
        self.data = {split: np.memmap(prepared.path(split), dtype=prepared.meta["dtype"], mode="r", shape=(n,))
                     for split, n in sizes.items()}
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        self._steps = np.arange(block_size + 1)
        # On CUDA a corpus that fits is copied to the GPU once, as int64; elsewhere batches read the mapped files.
        if resident is None:
            resident = self.device.type == "cuda" and sum(sizes.values()) * 8 <= RESIDENT_MAX_BYTES
        self.resident = None
        if resident:
            self.resident = {split: torch.from_numpy(d.astype(np.int64)).to(self.device)
                             for split, d in self.data.items()}
            self._steps_t = torch.arange(block_size + 1, device=self.device)

    def get_batch(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of a split from the training stream: x and y, (B, T) each."""
        data = self.data[split]
        starts = torch.randint(len(data) - self.block_size, (self.batch_size * self.world_size,),
                               generator=self.generator)
        mine = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]  # this rank's share
        if self.resident is not None:
            tokens = self.resident[split][send(mine, self.device)[:, None] + self._steps_t]  # (B, T+1)
        else:
            tokens = send(torch.from_numpy(data[mine.numpy()[:, None] + self._steps].astype(np.int64)), self.device)
        return tokens[:, :-1], tokens[:, 1:]

    def fixed_batches(self, split: str, n: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """n x batch_size random windows, the same at every call; a rank's share under DDP."""
        generator = torch.Generator().manual_seed(self.seed + 1 + ("train", "val").index(split))
        starts = torch.randint(len(self.data[split]) - self.block_size, (n * self.batch_size,), generator=generator)
        yield from self._padded(split, starts.numpy()[self.rank::self.world_size], self.num_fixed_batches(n),
                                self.batch_size)

    def num_fixed_batches(self, n: int) -> int:
        """How many batches fixed_batches(split, n) yields on rank 0, the most of any rank."""
        share = -(-n * self.batch_size // self.world_size)  # rounded up
        return -(-share // self.batch_size)

    def val_windows(self, batch_size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every validation window, side by side, in batches of one size; a rank's share under DDP."""
        step = batch_size or self.batch_size
        yield from self._padded("val", self._val_starts(), self.num_val_batches(step), step)

    def _padded(self, split: str, starts: np.ndarray, n_batches: int,
                step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The windows at starts, in n_batches batches of step rows; rows past the last have targets -1 (ignored)."""
        for i in range(0, n_batches * step, step):
            n_pad = step - len(starts[i:i + step])
            windows = self.data[split][np.pad(starts[i:i + step], (0, n_pad))[:, None] + self._steps]  # (B, T+1)
            tokens = send(torch.from_numpy(windows.astype(np.int64)), self.device)
            x, y = tokens[:, :-1], tokens[:, 1:]  # (B, T) each
            if n_pad:  # a new y (y shares x's memory), laid out as the other batches'
                padded = y.new_full((step, self.block_size + 1), -1)[:, 1:]
                padded[:step - n_pad] = y[:step - n_pad]
                y = padded
            yield x, y

    def _val_starts(self, rank: int | None = None) -> np.ndarray:
        return val_window_starts(len(self.data["val"]), self.block_size)[self.rank if rank is None else
                                                                         rank::self.world_size]

    def val_fits(self, n_batches: int) -> bool:
        """Whether the validation split has no more windows than n_batches batches."""
        return len(val_window_starts(len(self.data["val"]), self.block_size)) <= n_batches * self.batch_size

    def num_evaluation_batches(self, eval_iters: int) -> int:
        """How many batches an evaluation reads on each rank."""
        estimate = self.num_fixed_batches(eval_iters)
        return estimate + (self.num_val_batches() if self.val_fits(eval_iters) else estimate)

    def num_val_batches(self, batch_size: int | None = None) -> int:
        """How many batches val_windows() yields, the same on every rank."""
        return -(-len(self._val_starts(rank=0)) // (batch_size or self.batch_size))  # rounded up

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def check_stride(stride: object, block_size: int) -> None:
    """Check a stride is a whole number from 1 to block_size."""
    check_type("stride", stride, numbers.Integral, "a whole number")
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride {stride}: must be between 1 and the model's block_size, {block_size}")


@dataclass(frozen=True)
class Windows:
    """Windows that score each of ids[1:] once, starting every stride characters."""
    n_ids: int
    block_size: int
    stride: int

    def __post_init__(self) -> None:
        check_stride(self.stride, self.block_size)

    def __len__(self) -> int:
        if self.n_ids < 2:
            return 0
        return max(0, -(-(self.n_ids - 1 - self.block_size) // self.stride)) + 1

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(begin, end, first scored target) of windows first .. first + count - 1, each an int64 tensor."""
        k = torch.arange(first, min(first + count, len(self)), dtype=torch.int64)
        end = (k * self.stride + self.block_size).clamp(max=self.n_ids - 1)
        before = ((k - 1) * self.stride + self.block_size).clamp(max=self.n_ids - 1)
        return k * self.stride, end, torch.where(k == 0, 1, before + 1)

    def by_length(self, first: int, count: int) -> list[tuple[int, slice]]:
        """Windows first .. first + count - 1 as (length, their rows of batch()): all block_size long but maybe the
        text's last."""
        rows = min(first + count, len(self)) - first
        last = first + rows - 1
        last_length = min(last * self.stride + self.block_size, self.n_ids - 1) - last * self.stride
        if last_length == self.block_size:
            return [(self.block_size, slice(0, rows))]
        return [(self.block_size, slice(0, rows - 1))] * (rows > 1) + [(last_length, slice(rows - 1, rows))]
