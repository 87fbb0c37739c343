"""Sampling as small functions: logits -> probabilities -> next token -> the generate loop (with a KV cache)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from model.gpt import GPT
from model.kv_cache import Decoding


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """(B, vocab) logits -> (B, vocab) probabilities, sharpened by temperature and cut by top-k / top-p."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # probability mass ranked above each token
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, vocab) logits -> (B,) next token ids; temperature 0 means greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def window_start(start: int, length: int, block_size: int) -> int:
    """Where a row's context begins once it has `length` tokens.

    The context may not outgrow the position table, so when it would, it slides forward to keep the last
    half block: the model then re-reads (prefills) those tokens at positions 0.. and decoding resumes with
    the cache. Cached and uncached generation use this same rule, so they produce the same text.
    """
    return start if length - start <= block_size else length - block_size // 2


def left_pad(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token lists -> (B, L) ids padded on the left with 0, and valid_lens (None when no row is padded)."""
    longest = max(len(r) for r in rows)
    idx = torch.tensor([[0] * (longest - len(r)) + r for r in rows], dtype=torch.long, device=device)
    lens = torch.tensor([len(r) for r in rows], device=device)
    return idx, (None if all(len(r) == longest for r in rows) else lens)


@torch.inference_mode()
def generate(model: GPT, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_token: Callable[[torch.Tensor], None] | None = None) -> list[list[int]]:
    """Continue each prompt by max_new_tokens tokens; prompts may differ in length (they are batched).

    Returns the new tokens of each row. on_token receives each step's (B,) tokens as they are drawn.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    block_size = model.config.block_size
    device = model.wte.weight.device
    tokens = [list(p) for p in prompts]
    starts = [window_start(0, len(p), block_size) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    state = Decoding()
    if use_cache and model.config.n_layer > 0:  # no blocks, nothing to cache
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else model.wte.weight.dtype
        cfg = model.config
        state = Decoding.cached(cfg.n_layer, len(prompts), cfg.n_head, block_size, cfg.head_size, device, dtype)

    def read_windows() -> torch.Tensor:
        """Run the model over every row's whole window (a prefill when caching); the last logits."""
        idx, state.valid_lens = left_pad([t[s:] for t, s in zip(tokens, starts)], device)
        state.reset()
        logits, _ = model(idx, decoding=state)
        return logits[:, -1]

    logits = read_windows()
    for step in range(max_new_tokens):
        next_ids = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
        if on_token is not None:
            on_token(next_ids)
        for row, token in enumerate(next_ids.tolist()):
            tokens[row].append(token)
            new[row].append(token)
        if step == max_new_tokens - 1:
            break
        moved = False
        for row in range(len(tokens)):
            start = window_start(starts[row], len(tokens[row]), block_size)
            moved |= start != starts[row]
            starts[row] = start
        if state.caches is None or moved:
            logits = read_windows()
        else:  # one new token per row, attending to the cached keys and values
            if state.valid_lens is not None:
                state.valid_lens = state.valid_lens + 1
            logits, _ = model(next_ids[:, None], decoding=state)
            logits = logits[:, -1]
    return new
