"""Sampling: logits -> probabilities -> next token -> the generate loop, with its key/value cache, windows that
slide past block_size, compiled step and chunks handed back."""
from __future__ import annotations

import contextlib
import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from data.loader import send
from errors import check_type, in_one_line
from model.gpt import GPT
from model.kv_cache import Decoding, LayerCache

DecodeStep = Callable[[GPT, torch.Tensor, Decoding], torch.Tensor]


def one_token_step(model: GPT, ids: torch.Tensor, state: Decoding) -> torch.Tensor:
    """(B, 1) new tokens at slot state.input_pos -> (B, vocab) logits of the next token."""
    return model(ids, decoding=state)[0][:, -1]


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


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, vocab) probabilities -> (B,) ids, as torch.multinomial draws but without its host sync.
    Each token waits Exp(1) / p_i; the first wins, with probability p_i."""
    waits = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / waits).argmax(dim=-1)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, vocab) logits -> (B,) next token ids; temperature 0 means greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    return draw(logits_to_probs(logits, temperature, top_k, top_p), generator)


@torch.inference_mode()
def generate(model: GPT, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_tokens: Callable[[torch.Tensor], None] | None = None,
             step: DecodeStep = one_token_step, chunk: int = 0, finite_only: bool = False) -> list[list[int]]:
    """Each prompt's max_new_tokens new tokens; prompts may differ in length.
    on_tokens gets them on the host, (B, chunk) at a time (chunk 0: 1 on a CPU, 16 on a GPU).
    finite_only: NaN or inf scores raise NonFiniteLogits."""
    rows = Rows(model, prompts, max_new_tokens, use_cache, step, on_tokens, chunk, finite_only)
    logits = rows.prefill()
    for i in range(max_new_tokens):
        next_ids = sample_next(logits, temperature, top_k, top_p, generator)  # (B,), on the device
        rows.append(next_ids, logits, last=i == max_new_tokens - 1)
        if i < max_new_tokens - 1:
            logits = rows.decode(next_ids)
    return rows.new_tokens()


# ---- the product's cases ----
class NonFiniteLogits(ValueError):
    def __init__(self):
        super().__init__("the next-token scores are not finite (NaN or inf)")


@dataclass(frozen=True)
class Sampling:
    """How the next character is drawn."""
    temperature: float = field(default=0.8, metadata={
        "type": float, "help": "0 = greedy; below 1 = safer, above 1 = wilder"})
    top_k: int | None = field(default=None, metadata={
        "type": int, "help": "sample only among the k likeliest characters"})
    top_p: float | None = field(default=None, metadata={
        "type": float, "help": "sample from the smallest set with this much probability"})

    def __post_init__(self):
        check_type("temperature", self.temperature, numbers.Real, "a number")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature {self.temperature}: must be 0 (greedy) or a positive number, not infinite")
        if self.top_k is not None:
            check_type("top_k", self.top_k, numbers.Integral, "a whole number")
            if self.top_k < 1:
                raise ValueError(f"top_k {self.top_k}: must be at least 1")
        if self.top_p is not None:
            check_type("top_p", self.top_p, numbers.Real, "a number")
            if not 0 < self.top_p <= 1:
                raise ValueError(f"top_p {self.top_p}: must be in (0, 1], e.g. 0.9")


def check_length_and_seed(max_new_tokens: object, seed: object) -> None:
    check_type("max_new_tokens", max_new_tokens, numbers.Integral, "a whole number")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens}: must be at least 1")
    if max_new_tokens > 2**40:
        raise ValueError(f"max_new_tokens {max_new_tokens}: must be at most 2^40 (and fit in memory)")
    check_type("seed", seed, numbers.Integral, "a whole number")
    if not 0 <= seed < 2**64:  # torch.Generator.manual_seed's range
        raise ValueError(f"seed {seed}: must be a whole number from 0 to 2^64 - 1")


def bytes_needed(model: GPT, rows: int, longest_prompt: int, max_new_tokens: int, use_cache: bool = True,
                 handed_back: bool = True) -> int:
    """About the memory sampling needs beyond the model."""
    cfg = model.config
    per_row = 8 * (longest_prompt + max_new_tokens * (2 if handed_back else 1))
    if use_cache:
        per_row += 2 * cfg.n_layer * cfg.block_size * cfg.n_embd * model.wte.weight.element_size()
    return rows * (64 + per_row)


class Rows:
    """The rows' tokens, left-padded to end in one column, read by the model and handed on."""

    def __init__(self, model: GPT, prompts: list[list[int]], max_new_tokens: int, use_cache: bool, step: DecodeStep,
                 on_tokens: Callable[[torch.Tensor], None] | None, chunk: int, finite_only: bool):
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.model, self.step = model, step
        self.block_size, self.device = model.config.block_size, model.wte.weight.device
        self.windows = [window(len(p), self.block_size) for p in prompts]  # each row's context length
        self.first = self.end = max(map(len, prompts))  # the first new column; the column after the last token
        self.tokens = torch.zeros(len(prompts), self.first + max_new_tokens, dtype=torch.long, device=self.device)
        self.tokens[:, :self.first] = on_device([[0] * (self.first - len(p)) + p for p in prompts], self.device)
        self.state = Decoding()
        if use_cache and model.config.n_layer > 0:
            dtype = torch.get_autocast_dtype(self.device.type) if torch.is_autocast_enabled(self.device.type) \
                else model.wte.weight.dtype
            self.state = Decoding(model_caches(model, len(prompts), self.device, dtype))
        self.in_use = 0  # slots of the caches filled so far
        self.slot = torch.zeros(1, dtype=torch.long, device=self.device)
        # Eager on a CPU, attention reads only the slots in use; elsewhere all, so shapes stay fixed.
        self.trim = self.device.type == "cpu" and step is one_token_step
        self.on_tokens, self.done = on_tokens, self.first  # the columns before done are handed on
        self.chunk = chunk or (16 if self.device.type == "cuda" else 1)
        self.finite = torch.ones(len(prompts), dtype=torch.bool, device=self.device) if finite_only else None
        self.pending = []  # a GPU's chunks on their way to the host

    def use(self, n: int | None) -> None:
        for cache in self.state.caches or ():
            cache.in_use = n

    def prefill(self) -> torch.Tensor:
        """(B, vocab) logits of the model over each row's context, which ends at column self.end."""
        first = [self.end - n for n in self.windows]  # where each row's context begins
        left = min(first)
        pad = [f - left for f in first]
        self.state.pad = on_device(pad, self.device) if any(pad) else None
        if self.state.caches:
            self.state.input_pos = torch.arange(self.end - left, device=self.device)
            self.in_use = self.end - left
            self.use(self.in_use if self.trim else None)
        return self.model(self.tokens[:, left:self.end], decoding=self.state)[0][:, -1]

    def decode(self, next_ids: torch.Tensor) -> torch.Tensor:
        """The logits after next_ids: a cached step, or the contexts read again."""
        self.end += 1
        grown = [n + 1 for n in self.windows]
        self.windows = [window(n, self.block_size) for n in grown]
        if not self.state.caches or self.windows != grown:
            return self.prefill()
        self.in_use += 1
        self.state.input_pos = self.slot.fill_(self.in_use - 1)  # one tensor: a CUDA graph's input
        if self.trim:
            self.use(self.in_use)
        return self.step(self.model, next_ids[:, None], self.state)

    def append(self, next_ids: torch.Tensor, logits: torch.Tensor, last: bool) -> None:
        """next_ids, drawn from logits, into column self.end; handed on once a chunk is full."""
        if self.finite is not None:
            self.finite.logical_and_(torch.isfinite(logits).all(dim=-1))
        self.tokens[:, self.end] = next_ids
        if self.on_tokens is None or (self.end + 1 - self.done < self.chunk and not last):
            return
        chunk, finite = self.tokens[:, self.done:self.end + 1], self.finite
        self.done = self.end + 1
        if chunk.device.type != "cuda":
            return self.hand_over(chunk.clone(), finite)
        event = torch.cuda.Event()  # a GPU's chunk is read a chunk later, so the host never waits
        self.pending.append((pinned(chunk), finite if finite is None else pinned(finite), event))
        event.record()
        while self.pending and (last or len(self.pending) > 1):
            host, finite, event = self.pending.pop(0)
            event.synchronize()
            self.hand_over(host, finite)

    def hand_over(self, tokens: torch.Tensor, finite: torch.Tensor | None) -> None:
        if finite is not None and not finite.all():
            raise NonFiniteLogits()
        self.on_tokens(tokens)

    def new_tokens(self) -> list[list[int]]:
        """The new tokens as lists, read with the finite flags at once."""
        if self.finite is None:
            return self.tokens[:, self.first:].tolist()
        rows = torch.cat([self.tokens[:, self.first:], self.finite[:, None].long()], dim=1).tolist()
        if not all(row[-1] for row in rows):
            raise NonFiniteLogits()
        return [row[:-1] for row in rows]


def model_caches(model: GPT, batch_size: int, device: torch.device, dtype: torch.dtype) -> list[LayerCache]:
    """The model's key/value caches, kept for the next call of this shape."""
    cfg, shape = model.config, (batch_size, device, dtype)
    if model.decode_caches is None or model.decode_caches[0] != shape:
        model.decode_caches = None  # free the old caches before allocating new ones
        made = Decoding.cached(cfg.n_layer, batch_size, cfg.n_head, cfg.block_size, cfg.head_size, device, dtype)
        model.decode_caches = (shape, made.caches)
    return model.decode_caches[1]


def window(length: int, block_size: int) -> int:
    """How many of a row's last tokens its context holds: past block_size it slides to keep the last half block."""
    return length if length <= block_size else block_size // 2


def on_device(values: list, device: torch.device) -> torch.Tensor:
    """Host numbers -> a long tensor on device, without making the host wait."""
    return send(torch.tensor(values, dtype=torch.long), device)


def compiled_step(device_type: str, backend: str | Callable = "inductor",
                  warn: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> DecodeStep:
    """one_token_step compiled for fixed shapes: CUDA graphs on CUDA, frozen weights and C++ matmuls on a CPU.
    A failed compile warns once and decodes uncompiled; a RecompileError goes through."""
    from torch._dynamo.exc import RecompileError
    from torch._inductor import config as inductor_config
    cpu_inductor = backend == "inductor" and device_type != "cuda"
    settings: dict = {}
    if backend == "inductor":
        settings = {"options": {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}} if cpu_inductor \
            else {"mode": "reduce-overhead"}
    compiled: DecodeStep | None = torch.compile(one_token_step, fullgraph=True, dynamic=False, backend=backend,
                                                **settings)

    def step(model: GPT, ids: torch.Tensor, state: Decoding) -> torch.Tensor:
        nonlocal compiled
        if compiled is not None:
            try:  # freezing is read while tracing too, where options= does not reach
                with inductor_config.patch(freezing=True) if cpu_inductor else contextlib.nullcontext():
                    return compiled(model, ids, state)
            except RecompileError:
                raise
            except Exception as err:  # the step writes only this slot: running it again is harmless
                warn(f"warning: compiling the decoding step failed ({in_one_line(err)}); "
                     f"sampling without it (leave out --compile)")
                compiled = None
        return one_token_step(model, ids, state)
    return step


def pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A queued copy of a GPU tensor in pinned host memory: read it once a later event has passed."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)
