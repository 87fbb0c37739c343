"""GPT: token + position embeddings, a stack of pre-LayerNorm transformer blocks, a vocabulary head."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention import CausalSelfAttention, attention_mask, rope_tables
from model.config import ModelConfig
from model.kv_cache import Decoding


class ReLUSquared(nn.Module):
    """relu(x)², the speedruns' nonlinearity (--activation relu2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class MLP(nn.Module):
    """Linear -> GELU (or ReLU²) -> Linear, four times wider inside."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.act = nn.GELU() if config.activation == "gelu" else ReLUSquared()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)); mlp and residual false drop those parts."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.residual = config.residual
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias) if config.residual else nn.Identity()
        self.attn = CausalSelfAttention(config)
        if config.mlp:
            self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias) if config.residual else nn.Identity()
        self.mlp = MLP(config) if config.mlp else None

    def forward(self, x: torch.Tensor, mask=None, cache=None, slots=None, rope=None) -> torch.Tensor:
        if not self.residual:
            x = self.attn(x, mask, cache, slots, rope)
            return self.mlp(x) if self.mlp is not None else x
        x = x + self.attn(self.ln_1(x), mask, cache, slots, rope)
        if self.mlp is not None:
            x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        # positions: a learned table, RoPE (q and k turned), or none (the causal mask alone)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position == "learned" else None
        if config.position == "rope":
            cos, sin = rope_tables(config.block_size, config.head_size)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(config.dropout)
        self.decode_caches: tuple | None = None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2: residual projections start smaller, so the stream does not grow with depth. zero_proj zeroes
        # them after the same draw, so every other weight stays the seed's.
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
                if config.zero_proj:
                    nn.init.zeros_(param)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, by default without the position table."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *,
                decoding: Decoding | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> (logits (B, T, vocab), loss or None); with decoding=, the next-token logits only."""
        T = idx.size(1)
        positions, mask = self.positions_and_mask(T, decoding, idx.device)
        x = self.wte(idx)  # (B, T, n_embd)
        rope = None
        if self.config.position == "learned":
            x = x + self.wpe(positions)
        elif self.config.position == "rope":
            rope = (self.rope_cos[positions], self.rope_sin[positions])  # (B or 1, T, head_size) each
        x = self.drop(x)
        caches = decoding.caches if decoding is not None and decoding.caches else [None] * len(self.blocks)
        slots = decoding.input_pos if decoding is not None else None
        for block, cache in zip(self.blocks, caches):
            x = block(x, mask, cache, slots, rope)
        x = self.ln_f(x)
        if decoding is not None and targets is None:
            x = x[:, -1:, :]
        logits = self.lm_head(x)  # (B, T, vocab)
        if self.config.logit_softcap:
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits / cap)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def positions_and_mask(self, T: int, decoding: Decoding | None, device: torch.device
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Each token's position, (1, T) or (B, T), and the mask over the keys (None: plain causal)."""
        # len(), not bool(): dynamo cannot trace bool() of a list
        cached = decoding is not None and decoding.caches is not None and len(decoding.caches) > 0
        pad = decoding.pad if decoding is not None else None
        if not cached:
            if T > self.config.block_size:
                raise ValueError(f"sequence of {T} tokens is longer than block_size {self.config.block_size}")
            slots, n_keys = torch.arange(T, device=device), T
        else:
            slots, n_keys = decoding.input_pos, decoding.caches[0].n_keys
            if decoding.caches[0].capacity > self.config.block_size:
                raise ValueError(f"a cache of {decoding.caches[0].capacity} slots is longer than block_size "
                                 f"{self.config.block_size}")
        if pad is None:
            # plain causal without a cache, and for one query after the slots in use: it sees them all
            if not cached or (T == 1 and decoding.caches[0].in_use is not None):
                return slots[None, :], None
            return slots[None, :], attention_mask(slots, n_keys)
        positions = (slots[None, :] - pad[:, None]).clamp(min=0)  # (B, T): from each row's first real token
        return positions, attention_mask(slots, n_keys, pad)
