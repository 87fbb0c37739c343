"""Attention as the tutorials write it, for any lengths and widths: the forms of scoring (FORMS, each declared once),
dot-product and additive scores, and attend(), scores -> weights -> a weighted sum of values."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Form:
    """One way of scoring a query against the keys (the setting attention_score)."""
    name: str
    scores: str  # how a score is made: "dot" (q·k), "additive" (w·tanh(q + k)), or "none" (no q or k: every score 0)
    scaled: bool  # divided by √d_k before the softmax
    fused: bool  # torch's fused kernel can compute it (scaled_dot_product_attention: dot products only)
    meaning: str  # what --help says of it
    formula: tuple[str, str]  # what a head computes, as the page writes it (English, Chinese)


FORMS = {form.name: form for form in (
    Form("scaled_dot", "dot", True, True, "q·k/√head_size", ("softmax(QKᵀ/√d) V", "softmax(QKᵀ/√d) V")),
    Form("dot", "dot", False, True, "q·k, unscaled", ("softmax(QKᵀ) V", "softmax(QKᵀ) V")),
    Form("additive", "additive", False, False, "w·tanh(q + k)",
         ("softmax(w·tanh(qᵢ + kⱼ)) V", "softmax(w·tanh(qᵢ + kⱼ)) V")),
    Form("uniform", "none", False, True, "no scores: every earlier token weighs the same",
         ("the mean of the past values (every weight 1/i)", "过去的值的平均（每个权重 1/i）")),
)}


def dot_product_scores(q: torch.Tensor, k: torch.Tensor, scaled: bool = True) -> torch.Tensor:
    """q (..., T_q, d_k), k (..., T_k, d_k) -> (..., T_q, T_k): q·k, over √d_k when scaled."""
    scores = q @ k.transpose(-2, -1)
    return scores / math.sqrt(k.size(-1)) if scaled else scores


def additive_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Bahdanau's wᵀ · tanh(q + k): q (..., T_q, h), k (..., T_k, h), w (h,) or (n_head, h)."""
    hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (..., T_q, T_k, h): every query-key pair
    return torch.einsum("...qkh,...h->...qk", hidden, w)


def attend(scores: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (..., T_q, T_k), values (..., T_k, d_v) -> (output, weights); keys not kept weigh 0."""
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = F.softmax(scores, dim=-1)  # each row sums to 1
    return weights @ values, weights
