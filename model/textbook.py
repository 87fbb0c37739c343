"""The tutorials' textbook attention: one head as the formula reads, heads side by side, and the padded softmax.
tests/test_attention.py proves them equal to model/attention.py."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import ModelConfig


# ---- padding: a mask is True where a query may attend to a key ----
def valid_key_mask(valid_lens: torch.Tensor, n_keys: int, padding: str) -> torch.Tensor:
    """valid_lens -> valid_lens.shape + (n_keys,), True on the real keys."""
    if padding not in ("left", "right"):
        raise ValueError(f"padding must be one of left, right, got {padding!r}")
    slots = torch.arange(n_keys, device=valid_lens.device)
    lens = valid_lens[..., None]
    return slots < lens if padding == "right" else slots >= n_keys - lens


def masked_softmax(scores: torch.Tensor, valid_lens: torch.Tensor | None, *, padding: str) -> torch.Tensor:
    """Softmax over the last axis, zero on padding keys; an empty row is zeros, not NaN."""
    if valid_lens is None:
        return F.softmax(scores, dim=-1)
    keep = valid_key_mask(valid_lens, scores.size(-1), padding)
    while keep.dim() < scores.dim():
        keep = keep.unsqueeze(1)
    weights = F.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)


# ---- one head at a time; heads side by side, concatenated ----
class Head(nn.Module):
    """One head of causal self-attention, as the formula reads."""

    def __init__(self, n_embd: int, head_size: int, block_size: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.query = nn.Linear(n_embd, head_size, bias=bias)
        self.key = nn.Linear(n_embd, head_size, bias=bias)
        self.value = nn.Linear(n_embd, head_size, bias=bias)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.size(1)
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, head_size) each
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))  # (B, T, T): scaled BEFORE the softmax
        scores = scores.masked_fill(self.tril[:T, :T] == 0, float("-inf"))  # no peeking at the future
        weights = F.softmax(scores, dim=-1)  # each row: how much this position takes from each earlier one
        weights = self.dropout(weights)
        return weights @ v  # (B, T, head_size): a weighted sum of values


class MultiHeadAttention(nn.Module):
    """Several heads side by side, concatenated and projected back to n_embd."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.heads = nn.ModuleList(
            Head(config.n_embd, config.head_size, config.block_size, config.dropout, config.bias)
            for _ in range(config.n_head)
        )
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, n_embd)
        return self.dropout(self.proj(out))
