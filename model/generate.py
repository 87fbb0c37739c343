"""Sampling as small functions: logits -> probabilities -> next token -> the generate loop (a fixed-size KV cache, the
tokens kept on the device, an optionally compiled decoding step)."""
from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from data.loader import send
from errors import in_one_line
from model.gpt import GPT
from model.kv_cache import Decoding, LayerCache

DecodeStep = Callable[[GPT, torch.Tensor, Decoding], torch.Tensor]


class NonFiniteLogits(ValueError):
    """A row's next-token scores held NaN or inf (weights too large to compute with, or damaged): what would be drawn
    from them is not the model's text."""


@dataclass(frozen=True)
class Sampling:
    """How the next character is drawn from the logits, declared once: scripts/sample.py's flags, TrainedRun.generate's
    keyword arguments (hubconf.py) and the attention page's controls take their names, defaults and meanings from
    these fields, and their checks from here. generate() takes them as keyword arguments: **asdict(Sampling(...))."""
    temperature: float = field(default=0.8, metadata={"type": float,
                                                      "help": "0 = greedy; below 1 = safer, above 1 = wilder"})
    top_k: int | None = field(default=None, metadata={"type": int,
                                                      "help": "sample only among the k likeliest characters"})
    top_p: float | None = field(default=None, metadata={"type": float,
                                                        "help": "sample from the smallest set with this much "
                                                                "probability"})

    def __post_init__(self):
        """A value of another type is a TypeError, one out of range a ValueError, each naming the option and its
        value."""
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


def check_type(name: str, value: object, kind: type, words: str) -> None:
    """A TypeError naming the option, its value and the type wanted, unless value is of kind (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} {value!r}: must be {words}, not {type(value).__name__}")


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed's largest
MAX_NEW_TOKENS = 2**40  # past any machine's memory (8 bytes a token), short of sizes torch cannot hold (2^63)


def check_length_and_seed(max_new_tokens: object, seed: object) -> None:
    """How many tokens generate() adds and the seed of its generator, as sample.py's --max_new_tokens and --seed and
    TrainedRun.generate's keywords take them: whole numbers (else a TypeError), from 1 to 2^40 and from 0 to 2^64 - 1
    (else a ValueError), each line naming the option and its value."""
    check_type("max_new_tokens", max_new_tokens, numbers.Integral, "a whole number")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens}: must be at least 1")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens {max_new_tokens}: must be at most 2^40 (and fit in memory)")
    check_type("seed", seed, numbers.Integral, "a whole number")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed {seed}: must be a whole number from 0 to 2^64 - 1")


def bytes_needed(model: GPT, rows: int, longest_prompt: int, max_new_tokens: int, use_cache: bool = True,
                 handed_back: bool = True) -> int:
    """About the memory sampling rows needs, beyond the model: each row's tokens, 8 bytes each, and the new ones
    again as they are handed back (not where a single row is printed as it is drawn: handed_back false); with the
    cache, each layer's keys and values for block_size positions; about 64 bytes of Python per row."""
    cfg = model.config
    per_row = 8 * (longest_prompt + max_new_tokens * (2 if handed_back else 1))
    if use_cache:
        per_row += 2 * cfg.n_layer * cfg.block_size * cfg.n_embd * model.wte.weight.element_size()
    return rows * (64 + per_row)


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
    """(B, vocab) probabilities -> (B,) token ids, one draw per row, without leaving the device.

    The exponential race: give every token an Exp(1) waiting time divided by its probability, and take the first to
    arrive; token i wins with probability p_i. torch.multinomial draws one sample the same way, from the same random
    numbers (on a CPU the two agree token for token), but first checks the probabilities on the host, which on a GPU
    makes every character wait for the device."""
    waits = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / waits).argmax(dim=-1)


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, vocab) logits -> (B,) next token ids; temperature 0 means greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    return draw(logits_to_probs(logits, temperature, top_k, top_p), generator)


def model_caches(model: GPT, batch_size: int, device: torch.device, dtype: torch.dtype) -> list[LayerCache]:
    """The model's key/value caches for batch_size rows, allocated at the first generate() call of that shape and
    reused by the next ones (gpt-fast's setup_caches): a GPU allocates them once, and a compiled step's CUDA graph,
    which reads them at fixed addresses, is recorded once (sample.py --stream calls generate() once per row). What a
    previous call left in them is never read: attention sees only the slots this call has written (the mask by slot,
    or the slots in use). One shape is kept per model; another replaces it."""
    cfg, shape = model.config, (batch_size, device, dtype)
    if model.decode_caches is None or model.decode_caches[0] != shape:
        model.decode_caches = None  # the old caches go before the new ones are allocated
        made = Decoding.cached(cfg.n_layer, batch_size, cfg.n_head, cfg.block_size, cfg.head_size, device, dtype)
        model.decode_caches = (shape, made.caches)
    return model.decode_caches[1]


def window_start(start: int, length: int, block_size: int) -> int:
    """Where a row's context begins once it has `length` tokens.

    The context may not outgrow the position table, so when it would, it slides forward to keep the last
    half block: the model then re-reads (prefills) those tokens at positions 0.. and decoding resumes with
    the cache. Cached and uncached generation use this same rule, so they produce the same text.
    """
    return start if length - start <= block_size else length - block_size // 2


def on_device(values: list, device: torch.device) -> torch.Tensor:
    """Host numbers -> a long tensor on device, without making the host wait (data.loader.send)."""
    return send(torch.tensor(values, dtype=torch.long), device)


def left_pad(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Token lists -> (B, L) ids padded on the left with 0."""
    longest = max(len(r) for r in rows)
    return on_device([[0] * (longest - len(r)) + r for r in rows], device)


def one_token_step(model: GPT, ids: torch.Tensor, state: Decoding) -> torch.Tensor:
    """The decoding step: (B, 1) new tokens at slot state.input_pos -> (B, vocab) next-token logits. Every call has
    the same shapes, so a compiled copy of it is compiled once (and on CUDA replayed as a CUDA graph)."""
    return model(ids, decoding=state)[0][:, -1]


def compiled_step(device_type: str, backend: str | Callable = "inductor",
                  warn: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> DecodeStep:
    """one_token_step through torch.compile: the whole model in one graph, for fixed shapes. On CUDA with CUDA graphs
    (mode reduce-overhead), so a step is one launch instead of a hundred. On a CPU with the weights frozen into the
    graph, packed once, and read by matrix products generated for their shapes (inductor's freezing, and max-autotune
    with its C++ template only, which needs no benchmarking), where eager calls a library routine per product: on a
    2-core CPU about 2.5x the characters per second of eager decoding (docs/sampling.md has the figures). It costs
    17-21 s of compilation per batch size there, in every process (frozen graphs are not cached). If compiling fails
    (no C++ compiler, a driver problem), it warns once and decodes uncompiled: the same text, only slower. A
    recompilation refused by torch._dynamo.config.error_on_recompile is not a compiler's failure but a check's
    (compiled once per shape): its RecompileError goes through to the caller."""
    from torch._dynamo.exc import RecompileError
    settings: dict = {}
    cpu_inductor = backend == "inductor" and device_type != "cuda"
    if backend == "inductor":
        settings = {"options": {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}} if cpu_inductor \
            else {"mode": "reduce-overhead"}
    compiled: DecodeStep | None = torch.compile(one_token_step, fullgraph=True, dynamic=False, backend=backend,
                                                **settings)
    if cpu_inductor:
        from torch._inductor import config as inductor_config

    def step(model: GPT, ids: torch.Tensor, state: Decoding) -> torch.Tensor:
        nonlocal compiled
        if compiled is not None:
            try:
                if cpu_inductor:  # freezing is read by dynamo's tracing too, where options= does not reach, and a
                    # call may trace (a new batch size): set around every call, 27 us, under 1% of a 3 ms step
                    with inductor_config.patch(freezing=True):
                        return compiled(model, ids, state)
                return compiled(model, ids, state)
            except RecompileError:
                raise
            except Exception as err:  # the step writes only this slot of the caches: running it again is harmless
                warn(f"warning: compiling the decoding step failed ({in_one_line(err)}); "
                     f"sampling without it (leave out --compile)")
                compiled = None
        return one_token_step(model, ids, state)
    return step


class Chunks:
    """Hands the new tokens to a callback in chunks, copied off the device without waiting for it: a chunk's copy
    is started when its last token is drawn and read a chunk later, by when the device has long finished it. With
    finite (a (B,) bool tensor on the device, False for a row once its scores were not finite) copied with each chunk,
    a chunk drawn from such scores is refused (NonFiniteLogits) instead of handed over."""

    def __init__(self, buffer: torch.Tensor, first: int, on_tokens: Callable[[torch.Tensor], None] | None, size: int,
                 finite: torch.Tensor | None = None):
        self.buffer, self.done, self.on_tokens, self.size, self.finite = buffer, first, on_tokens, size, finite
        self.pending: list[tuple[torch.Tensor, torch.Tensor | None, object]] = []

    def drawn(self, end: int, last: bool = False) -> None:
        """The tokens up to column end are drawn (their kernels queued)."""
        if self.on_tokens is None or (end - self.done < self.size and not last):
            return
        chunk = self.buffer[:, self.done:end]
        if chunk.device.type == "cuda":
            host = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=True)
            host.copy_(chunk, non_blocking=True)
            finite = None
            if self.finite is not None:
                finite = torch.empty(self.finite.shape, dtype=torch.bool, pin_memory=True)
                finite.copy_(self.finite, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((host, finite, event))
        else:
            self.pending.append((chunk.clone(), None if self.finite is None else self.finite.clone(), None))
        self.done = end
        while self.pending and (last or len(self.pending) > 1 or self.pending[0][2] is None):
            host, finite, event = self.pending.pop(0)
            if event is not None:
                event.synchronize()
            if finite is not None and not finite.all():
                raise NonFiniteLogits("the next-token scores are not finite (NaN or inf)")
            self.on_tokens(host)


@torch.inference_mode()
def generate(model: GPT, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_tokens: Callable[[torch.Tensor], None] | None = None,
             step: DecodeStep = one_token_step, chunk: int = 0, finite_only: bool = False) -> list[list[int]]:
    """Continue each prompt by max_new_tokens tokens; prompts may differ in length (they are batched, left-padded).

    Returns the new tokens of each row. on_tokens receives (B, n) tensors of new tokens, in order, on the host:
    every token as it is drawn on a CPU, chunk (default 16) at a time on a GPU. step is the decoding step
    (compiled_step() for a compiled one). Between windows nothing is read back from the device: the tokens stay
    there, positions and masks are tensors, and the token is chosen on the device. finite_only: scores that are not
    finite (NaN or inf) anywhere raise NonFiniteLogits rather than give tokens drawn from them: a flag kept on the
    device and read with the tokens (still one read at the end), or with each chunk handed to on_tokens.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    cfg, device = model.config, model.wte.weight.device
    lengths = [len(p) for p in prompts]  # every row's token count is known without reading a token back
    starts = [window_start(0, n, cfg.block_size) for n in lengths]
    longest = max(lengths)
    # Every row's tokens, left-padded so that all rows end in the same column: (B, longest + max_new_tokens).
    buffer = torch.zeros(len(prompts), longest + max_new_tokens, dtype=torch.long, device=device)
    buffer[:, :longest] = left_pad(prompts, device)
    state = Decoding()
    if use_cache and cfg.n_layer > 0:  # no blocks, nothing to cache
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) \
            else model.wte.weight.dtype
        state = Decoding(model_caches(model, len(prompts), device, dtype))
    in_use = 0  # slots of the caches filled so far: known here without reading the device
    slot = torch.zeros(1, dtype=torch.long, device=device)  # the decoding step's slot, in_use - 1, on the device
    # Eager on a CPU, attention reads only the slots in use (shapes may change there at no cost); on a GPU, or with a
    # compiled step, every step reads the whole cache: the same shapes every time.
    trim = device.type == "cpu" and step is one_token_step

    def use(n: int) -> None:
        for cache in state.caches or ():
            cache.in_use = n

    def read_windows(end: int) -> torch.Tensor:
        """Run the model over every row's whole window, which ends at column end (a prefill when caching)."""
        first = [end - (n - s) for n, s in zip(lengths, starts)]  # the column where each row's window begins
        left = min(first)
        pad = [f - left for f in first]
        state.pad = on_device(pad, device) if any(pad) else None
        nonlocal in_use
        width = end - left
        if state.caches:
            state.input_pos = torch.arange(width, device=device)
            in_use = width
            use(in_use if trim else None)
        return model(buffer[:, left:end], decoding=state)[0][:, -1]

    finite = torch.ones(len(prompts), dtype=torch.bool, device=device) if finite_only else None
    chunks = Chunks(buffer, longest, on_tokens, chunk or (16 if device.type == "cuda" else 1), finite)
    logits = read_windows(longest)
    for i in range(max_new_tokens):
        column = longest + i
        if finite is not None:
            finite.logical_and_(torch.isfinite(logits).all(dim=-1))
        next_ids = sample_next(logits, temperature, top_k, top_p, generator)  # (B,), on the device
        buffer[:, column] = next_ids
        chunks.drawn(column + 1, last=i == max_new_tokens - 1)
        if i == max_new_tokens - 1:
            break
        lengths = [n + 1 for n in lengths]
        moved = [window_start(s, n, cfg.block_size) for s, n in zip(starts, lengths)]
        if not state.caches or moved != starts:
            starts = moved
            logits = read_windows(column + 1)
        else:  # one new token per row, written at the next slot of the caches
            in_use += 1
            state.input_pos = slot.fill_(in_use - 1)  # in place: the same tensor every step (a CUDA graph's input)
            if trim:
                use(in_use)
            logits = step(model, next_ids[:, None], state)  # a (B, 1) tensor of its own: the same strides every call
    if finite is None:
        return buffer[:, longest:].tolist()
    rows = torch.cat([buffer[:, longest:], finite[:, None].long()], dim=1).tolist()  # tokens and flag: one read
    if not all(row[-1] for row in rows):
        raise NonFiniteLogits("the next-token scores are not finite (NaN or inf)")
    return [row[:-1] for row in rows]
