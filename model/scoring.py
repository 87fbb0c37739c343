"""Attention as the tutorials write it, for any number of queries and keys and values of any width: the two
scoring functions (dot-product, scaled by 1/√d_k or not, and additive) and attend(), which turns scores into
weights and the weights into a weighted sum of values."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def dot_product_scores(q: torch.Tensor, k: torch.Tensor, scaled: bool = True) -> torch.Tensor:
    """Queries (..., T_q, d_k) and keys (..., T_k, d_k) -> scores (..., T_q, T_k): q·k, divided by √d_k when scaled,
    so that scores of unit-variance q and k keep unit variance whatever d_k is."""
    scores = q @ k.transpose(-2, -1)
    return scores / math.sqrt(k.size(-1)) if scaled else scores


def additive_scores(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                    w_v: torch.Tensor) -> torch.Tensor:
    """Additive attention (Bahdanau): score(q, k) = w_vᵀ · tanh(q W_q + k W_k).

    q (..., T_q, d_q) and k (..., T_k, d_k) may have different widths: W_q (d_q, h) and W_k (d_k, h) bring both to
    h hidden units, w_v (h,) reads one number off each pair. Returns scores (..., T_q, T_k).
    """
    hidden = (q @ w_q).unsqueeze(-2) + (k @ w_k).unsqueeze(-3)  # (..., T_q, 1, h) + (..., 1, T_k, h): every pair
    return torch.tanh(hidden) @ w_v


def attend(scores: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (..., T_q, T_k) and values (..., T_k, d_v) -> (output (..., T_q, d_v), weights (..., T_q, T_k)).

    keep (broadcastable to the scores) is True where a query may look at a key; the others get weight 0.
    """
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = F.softmax(scores, dim=-1)  # each row sums to 1
    return weights @ values, weights
