"""The model's causal self-attention, all heads batched: the textbook steps (q·kᵀ/√d, mask, softmax, weighted sum)
and torch's fused kernel, rotary positions and the causal mask by slot."""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import ModelConfig
from model.kv_cache import LayerCache
from model.scoring import FORMS, additive_scores, dot_product_scores


# ---- rotary positions (RoPE): q and k turned by angles that grow with position ----
ROPE_BASE = 10000.0  # RoFormer's: frequency i is base^(-2i/head_size)


def rope_tables(block_size: int, head_size: int, base: float = ROPE_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, each (block_size, head_size); dimension i pairs with i + head_size/2."""
    frequencies = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[i], x[i + head_size/2]) by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# ---- the mask: True where a query may attend to a key ----
def attention_mask(slots: torch.Tensor, n_keys: int, pad: torch.Tensor | None = None) -> torch.Tensor:
    """The tril by slot, (B or 1, 1, T, n_keys), hiding each row's pad; a pad query sees itself."""
    key_slots = torch.arange(n_keys, device=slots.device)
    mask = key_slots[None, :] <= slots[:, None]  # (T, n_keys)
    if pad is None:
        return mask[None, None]
    real_keys = key_slots[None, :] >= pad[:, None]  # (B, n_keys)
    mask = mask[None] & (real_keys[:, None, :] | (key_slots[None, :] == slots[:, None])[None])
    return mask[:, None]  # (B, 1, T, n_keys)


# ---- the batched form the model trains with ----
def fused_attention(q, k, v, mask, dropout_p: float, causal: bool, scale: float | None = None) -> torch.Tensor:
    """torch's scaled_dot_product_attention; float32 on a CPU, where bfloat16's backward is slow."""
    if q.device.type == "cpu" and (torch.is_autocast_enabled("cpu") or v.dtype != torch.float32):
        with torch.autocast("cpu", enabled=False):
            return fused_attention(q.float(), k.float(), v.float(), mask, dropout_p, causal, scale).to(v.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale)


class CausalSelfAttention(nn.Module):
    """All heads at once, (B, n_head, T, head_size): the textbook steps or the fused kernel."""

    def __init__(self, config: ModelConfig, path: str = ""):
        super().__init__()
        self.n_head, self.head_size = config.n_head, config.head_size
        self.shared_qk, self.own_values = config.shared_qk, config.attention_values
        self.qk_norm = config.qk_norm
        self.form = FORMS[config.attention_score]
        learned_qk = 0 if self.form.scores == "none" else 1 if self.shared_qk else 2
        parts = learned_qk + (1 if self.own_values else 0)  # n_embd-wide projections in c_attn
        self.c_attn = nn.Linear(config.n_embd, parts * config.n_embd, bias=config.bias) if parts else None
        if self.form.scores == "additive":  # w: one vector per head, reading a score off tanh(q + k)
            self.w_score = nn.Parameter(torch.randn(config.n_head, config.head_size) / math.sqrt(config.head_size))
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.path = path or config.attention
        self.record: list[torch.Tensor] | None = None  # set by recording_attention

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: LayerCache | None = None,
                slots: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, n_embd) -> (B, T, n_embd); mask None means plain causal."""
        B, T, C = x.shape
        q, k, v = self.projections(x)  # (B, T, n_head, head_size) each
        if self.qk_norm:
            q, k = F.rms_norm(q, (self.head_size,)), F.rms_norm(k, (self.head_size,))
        if rope is not None:
            cos, sin = (table.view(table.size(0), T, 1, self.head_size) for table in rope)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, n_head, T, head_size) each
        if cache is not None:
            k, v = cache.write(slots, k, v)  # (B, n_head, capacity, head_size)
        # No mask: causal when queries and keys are the same positions; one new query after cached keys sees them all.
        causal = mask is None and k.size(2) == T
        if not self.fused_here(q):  # the textbook
            scores = self.scores(q, k)  # (B, n_head, T, T_keys): q·kᵀ/√d
            keep = attention_mask(torch.arange(T, device=x.device), T) if causal else mask  # the tril
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))  # future (and padding) keys get zero weight
            weights = F.softmax(scores, dim=-1)
            if self.record is not None:
                self.record.append(weights)
            y = self.attn_dropout(weights) @ v  # (B, n_head, T, head_size)
        else:  # the same, by torch's fused kernel
            dropout_p = self.attn_dropout.p if self.training else 0.0
            y = fused_attention(q, k, v, mask, dropout_p, causal, scale=None if self.form.scaled else 1.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, n_embd): heads side by side again
        return self.resid_dropout(self.c_proj(y))

    def fused_here(self, q: torch.Tensor) -> bool:
        """Whether the fused kernel runs (not compiled on a CPU in bfloat16: inductor is faster)."""
        if self.path == "explicit" or self.record is not None or not self.form.fused:
            return False
        return not (torch.compiler.is_compiling() and q.device.type == "cpu" and torch.is_autocast_enabled("cpu"))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, n_embd) -> q, k, v, each (B, T, n_head, head_size)."""
        B, T, C = x.shape
        made = list(self.c_attn(x).split(C, dim=-1)) if self.c_attn is not None else []
        v = made.pop() if self.own_values else x  # without values, each head mixes its own slice of x
        if self.form.scores == "none":
            q = k = torch.zeros_like(v)  # equal scores: every visible key weighs the same
        else:
            q = made[0]
            k = q if self.shared_qk else made[1]
        return tuple(t.view(B, T, self.n_head, self.head_size) for t in (q, k, v))

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, n_head, T, head_size) queries and (B, n_head, T_keys, head_size) keys -> (B, n_head, T, T_keys)."""
        if self.form.scores == "additive":
            return additive_scores(q, k, self.w_score)
        return dot_product_scores(q, k, scaled=self.form.scaled)  # scaled BEFORE the softmax


@contextmanager
def recording_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """with recording_attention(model) as weights: model(idx) appends each layer's (B, n_head, T, T_keys)."""
    weights: list[torch.Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    for layer in layers:
        layer.record = weights
    try:
        yield weights
    finally:
        for layer in layers:
            layer.record = None


@torch.inference_mode()
def attention_weights(model: nn.Module, ids: list[int]) -> list[torch.Tensor]:
    """Each layer's (n_head, T, T) attention weights for one text; the model's mode is kept."""
    was_training = model.training
    model.eval()
    try:
        with recording_attention(model) as weights:
            model(torch.tensor([ids], device=next(model.parameters()).device))
    finally:
        model.train(was_training)
    return [w[0] for w in weights]
