"""The model's causal self-attention: all heads batched, an explicit path (q·kᵀ/√d, mask, softmax, weighted sum)
and the fused kernel's, rotary positions (q and k turned by their positions' angles), the causal mask by slot, and
recording of the weights. The one-head-at-a-time textbook form the tutorials run is in model/textbook.py, and the
tests prove the two compute the same."""
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


# ---------------------------------------------------------------------------------------------
# Rotary positions (RoPE): q and k turned by angles that grow with position, instead of a position table.
# ---------------------------------------------------------------------------------------------
ROPE_BASE = 10000.0  # the wavelength scale of the rotary angles (RoFormer's): frequency i is base^(-2i/head_size)


def rope_tables(block_size: int, head_size: int, base: float = ROPE_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, each (block_size, head_size): dimension i and i + head_size/2
    form a pair that turns by the same angle, so each half repeats the other's frequencies."""
    frequencies = base ** (-torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float32), frequencies)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[i], x[i + head_size/2]) of x (..., head_size) by its position's angle.

    cos, sin broadcast against x and hold each token's row of the tables. A rotation keeps lengths, and the
    dot product of a rotated q and k depends only on the distance between their positions.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


# ---------------------------------------------------------------------------------------------
# The mask. A boolean mask is True where a query may attend to a key.
# ---------------------------------------------------------------------------------------------
def attention_mask(slots: torch.Tensor, n_keys: int, pad: torch.Tensor | None = None) -> torch.Tensor:
    """Causal (and, with pad, padding-aware) mask of queries at slots (T,) over the keys at slots 0..n_keys-1.

    Shape (B or 1, 1, T, n_keys): a query sees its own slot and every earlier one (the tril, read off by slot, so a
    fixed-size cache needs no other bookkeeping); with pad (B,), not the first pad[b] slots of row b, which are
    padding. A padding query may always see itself, so that no row is empty (an all-masked row would turn into NaN
    and spread through the weighted sum).
    """
    key_slots = torch.arange(n_keys, device=slots.device)
    mask = key_slots[None, :] <= slots[:, None]  # (T, n_keys)
    if pad is None:
        return mask[None, None]
    real_keys = key_slots[None, :] >= pad[:, None]  # (B, n_keys)
    mask = mask[None] & (real_keys[:, None, :] | (key_slots[None, :] == slots[:, None])[None])
    return mask[:, None]  # (B, 1, T, n_keys)


# ---------------------------------------------------------------------------------------------
# The batched form the model trains with: all heads in one tensor, two interchangeable paths.
# ---------------------------------------------------------------------------------------------
def fused_attention(q, k, v, mask, dropout_p: float, causal: bool, scale: float | None = None) -> torch.Tensor:
    """torch's scaled_dot_product_attention. On CPU it runs in float32 even under bfloat16 autocast: there the
    kernel's bfloat16 backward is several times slower than its float32 one, while the attention products are a small
    share of the work at these sizes (docs/speed.md). The projections around it stay bfloat16."""
    if q.device.type == "cpu" and (torch.is_autocast_enabled("cpu") or v.dtype != torch.float32):
        # Under autocast the kernel would take bfloat16 even from float32 inputs (rotary positions make q and k
        # float32 while v stays bfloat16): autocast is turned off around it.
        with torch.autocast("cpu", enabled=False):
            y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                               dropout_p=dropout_p, is_causal=causal, scale=scale)
        return y.to(v.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=scale)


def written_out_when_compiled(q: torch.Tensor) -> bool:
    """Whether the fused path takes the explicit one's steps instead: inside torch.compile, on a CPU, under bfloat16
    autocast. There inductor fuses the scaling, mask and softmax around two bfloat16 products, faster than the fused
    kernel, which runs in float32 there (fused_attention); in float32 the compiled kernel is the faster one
    (docs/speed.md has both)."""
    # is_compiling() first: in eager code (the sampler calls this once a layer a character) it answers at once
    return torch.compiler.is_compiling() and q.device.type == "cpu" and torch.is_autocast_enabled("cpu")


class CausalSelfAttention(nn.Module):
    """All heads at once: one fused projection for q, k and v, and (B, n_head, T, head_size) tensors.

    path "explicit" spells out q·kᵀ/√d, mask, softmax, weighted sum (and can record the weights);
    path "sdpa" calls torch's fused scaled_dot_product_attention (flash / memory-efficient kernels), except inside
    torch.compile on a CPU in bfloat16, where the explicit steps compile faster (written_out_when_compiled).

    The forms the tutorials teach, chosen by the config (each changes only projections() or scores()):
    attention_score, one of model/scoring.py's FORMS (scaled_dot, the default; dot, no 1/√d; additive, w·tanh(q + k),
    explicit path only; uniform, q = k = 0, so every visible key weighs the same: a plain average of the past);
    shared_qk (one projection gives both q and k); attention_values false (v is the input itself, head by head).
    qk_norm scales every query and key to the same root-mean-square before they meet (not a tutorial form).
    """

    def __init__(self, config: ModelConfig, path: str = "sdpa"):
        super().__init__()
        self.n_head, self.head_size = config.n_head, config.head_size
        self.shared_qk, self.own_values = config.shared_qk, config.attention_values
        self.qk_norm = config.qk_norm
        self.form = FORMS[config.attention_score]
        learned_qk = 0 if self.form.scores == "none" else 1 if self.shared_qk else 2
        parts = learned_qk + (1 if self.own_values else 0)  # how many n_embd-wide projections c_attn makes
        self.c_attn = nn.Linear(config.n_embd, parts * config.n_embd, bias=config.bias) if parts else None
        if self.form.scores == "additive":  # w: one vector per head that reads a score off tanh(q + k)
            self.w_score = nn.Parameter(torch.randn(config.n_head, config.head_size) / math.sqrt(config.head_size))
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.path = path
        self.scaled, self.fusable = self.form.scaled, self.form.fused  # (an unfused form takes the explicit path)
        self.record: list[torch.Tensor] | None = None  # set by recording_attention()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, cache: LayerCache | None = None,
                slots: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, n_embd) -> (B, T, n_embd).

        mask: None means plain causal over x; otherwise a boolean attention_mask() over all keys.
        cache: this call's keys/values are written into it at slots (T,), and attention reads all of its slots.
        rope: (cos, sin) at each token's position, when the model uses rotary position embeddings.
        Inside recording_attention(), the weights (B, n_head, T, T_keys) are appended to its list.
        """
        B, T, C = x.shape
        q, k, v = self.projections(x)  # (B, T, n_head, head_size) each
        if self.qk_norm:  # every query and key to the same length: scores depend on direction only
            q, k = F.rms_norm(q, (self.head_size,)), F.rms_norm(k, (self.head_size,))
        if rope is not None:  # rotary positions: turn q and k by their positions' angles
            cos, sin = (table.view(table.size(0), T, 1, self.head_size) for table in rope)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, n_head, T, head_size) each
        if cache is not None:
            k, v = cache.write(slots, k, v)  # (B, n_head, capacity, head_size)
        # No mask: plain causal when queries and keys are the same positions; a single new query after cached keys may
        # see them all. (SDPA's is_causal aligns its triangle to the top-left corner, wrong once the lengths differ.)
        causal = mask is None and k.size(2) == T
        if self.path == "explicit" or self.record is not None or not self.fusable or written_out_when_compiled(q):
            scores = self.scores(q, k)  # (B, n_head, T, T_keys)
            # the tril, made for this T (a stored block_size x block_size one would cost block_size² bytes a layer)
            keep = attention_mask(torch.arange(T, device=x.device), T) if causal else mask
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))  # future (and padding) keys get zero weight
            weights = F.softmax(scores, dim=-1)
            if self.record is not None:
                self.record.append(weights)
            y = self.attn_dropout(weights) @ v  # (B, n_head, T, head_size)
        else:
            dropout_p = self.dropout if self.training else 0.0
            y = fused_attention(q, k, v, mask, dropout_p, causal, scale=None if self.scaled else 1.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, n_embd): heads side by side again
        return self.resid_dropout(self.c_proj(y))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, n_embd) -> q, k, v, each (B, T, n_head, head_size), as the chosen form makes them."""
        B, T, C = x.shape
        made = list(self.c_attn(x).split(C, dim=-1)) if self.c_attn is not None else []
        v = made.pop() if self.own_values else x  # without values, each head mixes its own slice of x
        if self.form.scores == "none":
            q = k = torch.zeros_like(v)  # equal scores everywhere: softmax gives every visible key the same weight
        else:
            q = made[0]
            k = q if self.shared_qk else made[1]
        return tuple(t.view(B, T, self.n_head, self.head_size) for t in (q, k, v))

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """(B, n_head, T, head_size) queries and (B, n_head, T_keys, head_size) keys -> (B, n_head, T, T_keys)."""
        if self.form.scores == "additive":  # every query-key pair, w_h · tanh(q_i + k_j), one w per head
            return additive_scores(q, k, self.w_score)
        return dot_product_scores(q, k, scaled=self.scaled)  # scaled BEFORE the softmax


@contextmanager
def recording_attention(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """with recording_attention(model) as weights: model(idx) -> weights holds each layer's attention weights,
    (B, n_head, T, T_keys), in layer order (computed by the explicit path while recording)."""
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
    """Each layer's (n_head, T, T) attention weights for one text, from the explicit path; the model is left in the
    mode it was in."""
    was_training = model.training
    model.eval()
    try:
        with recording_attention(model) as weights:
            model(torch.tensor([ids], device=next(model.parameters()).device))
    finally:
        model.train(was_training)
    return [w[0] for w in weights]
