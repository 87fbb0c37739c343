"""Attention as the tutorials write it, for any number of queries and keys and values of any width: the two
scoring functions (dot-product, scaled by 1/√d_k or not, and additive) and attend(), which turns scores into
weights and the weights into a weighted sum of values. The model's attention scores with the same functions."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def dot_product_scores(q: torch.Tensor, k: torch.Tensor, scaled: bool = True) -> torch.Tensor:
    """Queries (..., T_q, d_k) and keys (..., T_k, d_k) -> scores (..., T_q, T_k): q·k, divided by √d_k when scaled,
    so that scores of unit-variance q and k keep unit variance whatever d_k is."""
    scores = q @ k.transpose(-2, -1)
    return scores / math.sqrt(k.size(-1)) if scaled else scores


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Additive attention (Bahdanau): score(q, k) = wᵀ · tanh(q + k), for queries and keys already brought to the
    same h hidden units (W_q q and W_k k, whatever widths q and k started with).

    q (..., T_q, h), k (..., T_k, h), w (h,) or one per leading index, e.g. (n_head, h). Returns (..., T_q, T_k).
    """
    hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (..., T_q, T_k, h): every query-key pair
    return torch.einsum("...qkh,...h->...qk", hidden, w)


def attend(scores: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (..., T_q, T_k) and values (..., T_k, d_v) -> (output (..., T_q, d_v), weights (..., T_q, T_k)).

    keep (broadcastable to the scores) is True where a query may look at a key; the others get weight 0.
    """
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = F.softmax(scores, dim=-1)  # each row sums to 1
    return weights @ values, weights
