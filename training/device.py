"""The run on its device: torch.compile with a fallback, random streams, FLOPs, the slowdown watch, torchrun."""
from __future__ import annotations

import contextlib
import copy
import os
import signal
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from common.machine import Runtime, gpus, is_out_of_memory, span, sync
from errors import QuietExit, StepAbandoned, UserError, in_one_line
from model.config import ModelConfig
from model.gpt import GPT


SLOWDOWN = 3.0  # steps this many times those timed before the first: the machine got busier
SLOW_FOR = 20.0  # seconds of such steps in one log interval: said at once


class SlowdownWatch:
    """Slow steps at two log lines in a row, or for SLOW_FOR seconds: said once, with advice."""

    def __init__(self, step_seconds: float, threads: int, resume: str):
        self.step_seconds, self.threads, self.resume = step_seconds, threads, resume
        self.limit = SLOWDOWN * step_seconds
        self.last_slow, self.said, self.advice = None, False, ""

    def seen(self, previous: int, it: int, step_seconds: float) -> str | None:
        """At a slow log line (previous: the step of the line before): the note, once."""
        in_a_row, self.last_slow = self.last_slow == previous, it
        if self.said or not (in_a_row or step_seconds * (it - previous) >= SLOW_FOR):
            return None
        self.said = True
        said = (f"note: steps now take {span([step_seconds])}, {step_seconds / self.step_seconds:.1f}x the "
                f"{span([self.step_seconds])} timed before the first step: other work is likely using the CPU")
        if self.threads == 1:
            return said + "; this run uses one thread already"
        self.advice = f"--num_threads {max(1, self.threads // 2)}"
        return f"{said}; fewer threads may go faster: Ctrl-C (it saves), then {self.resume} {self.advice}"


# ---- torch.compile ----
def compile_wanted(setting: str, device_type: str) -> bool:
    return setting == "true" or (setting == "auto" and device_type == "cuda")


DEVICE_ERRORS = (torch.AcceleratorError,) if hasattr(torch, "AcceleratorError") else ()  # CUDA errors
COMPILE_FAILED = "warning: torch.compile failed ({}); continuing without it (--compile false skips the attempt)"


class CompileFallback:
    """Calls `compiled` until the compiler fails; then warns once, calls `uncompile`, and calls `module`."""

    def __init__(self, module, compiled: Callable, say=print, uncompile: Callable[[], None] = lambda: None):
        self.module, self.compiled, self.say, self.uncompile = module, compiled, say, uncompile
        # the backward compiles outside this call: first_compiled_backward() checks it
        self.backward_unchecked = True

    @staticmethod
    def compilers(err: Exception) -> bool:
        return not (is_out_of_memory(err) or isinstance(err, DEVICE_ERRORS))

    def give_up(self, reason: str) -> None:
        self.say(COMPILE_FAILED.format(reason))
        self.compiled, self.backward_unchecked = None, False
        self.uncompile()

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # an inductor or driver problem must not end the run
                if not self.compilers(err):
                    raise
                self.give_up(in_one_line(err))
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def first_compiled_backward(model: CompileFallback, batches, rt: Runtime, d: "Dist",
                            forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor:
    """forward_backward() with a backward that compiles now; on failure or non-finite gradients, rerun uncompiled.
    Under DDP every rank falls back if any does."""
    batches_began, random_began = batches.state_dict(), random_states(rt.device)
    no_sync = model.no_sync if d.enabled else contextlib.nullcontext
    failure = None
    try:
        with no_sync():
            loss = forward_backward()
        flags = [p.grad.isfinite().all() for p in model.parameters() if p.grad is not None]
        if rt.dtype != torch.float16 and flags and not torch.stack(flags).all():  # one read
            failure = "its first step's gradients were not finite; that step is computed again uncompiled"
    except StepAbandoned:
        raise
    except Exception as err:
        if not model.compilers(err):
            raise
        failure = in_one_line(err)
    if failure is not None and d.world_size > 1:
        failure = f"rank {d.rank}: {failure}"  # (out of the except block: the failed attempt is freed first)
    failure = d.first(failure)
    model.backward_unchecked = False
    if failure is not None:
        batches.load_state_dict(batches_began)
        set_random_states(rt.device, random_began)
        model.zero_grad(set_to_none=True)
        model.give_up(failure)
        with no_sync():
            loss = forward_backward()
    d.average([p.grad for p in model.parameters() if p.grad is not None])
    return loss


def random_states(device: torch.device) -> tuple:
    """The random streams dropout draws from."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_random_states(device: torch.device, states: tuple) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], device)


AUTOTUNE_TABLES = {"autotune_num_choices_displayed": ("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", 0),
                   "max_autotune_report_choices_stats": ("TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS", False)}


def quiet_autotuning() -> None:
    """max-autotune without inductor's timing tables (unless asked for) or TypedStorage warning."""
    from torch._inductor import config
    for name, (variable, quiet) in AUTOTUNE_TABLES.items():
        if variable not in os.environ and hasattr(config, name):
            setattr(config, name, quiet)
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, r"torch\.")


def step_and_eval_models(model: GPT, wrap: Callable[[nn.Module], nn.Module], setting: str, device_type: str,
                         mode: str = "default", scope: str = "blocks", compile_eval: bool = True, say=print,
                         gave_up: Callable[[], None] = lambda: None):
    """The models the step and evaluations call; wrap adds DDP."""
    if not compile_wanted(setting, device_type):
        step_model = wrap(model)
        return step_model, step_model
    mode_arg = None if mode == "default" else mode
    if mode.startswith("max-autotune"):
        quiet_autotuning()
    whole = wrap(model) if scope == "model" else None  # compiled with its DDP wrapper
    try:
        if whole is not None:
            compiled = torch.compile(whole, mode=mode_arg)
        else:  # a view of model whose blocks are compiled: one graph every layer runs
            view = copy.copy(model)  # shares everything but the list of blocks
            blocks = nn.ModuleList(torch.compile(block, mode=mode_arg) for block in model.blocks)
            view._modules = {**model._modules, "blocks": blocks}
    except RuntimeError as err:
        say(COMPILE_FAILED.format(in_one_line(err)))
        gave_up()
        step_model = whole if whole is not None else wrap(model)
        return step_model, step_model
    if whole is not None:
        compiled = CompileFallback(whole, compiled, say, gave_up)
    else:
        step_model = wrap(view)

        def uncompile() -> None:
            view._modules["blocks"] = model.blocks
            gave_up()
        compiled = CompileFallback(step_model, step_model, say, uncompile)
    return compiled, compiled if compile_eval else model


# ---- performance figures ----
def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 per parameter plus attention's 12·L·C·T."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def measure_peak_flops(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]] = (),
                       seconds: float = 0.03, trials: int = 3) -> float:
    """The best FLOP/s of matrix products: a large square one and the model's (m, k, n) shapes."""
    size = 8192 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)  # the global RNG untouched
    best = 0.0
    for m, k, n in [(size, size, size), *shapes]:
        a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
        b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
        a @ b  # warm-up
        for _ in range(trials):
            sync(device)
            reps, start, elapsed = 0, time.perf_counter(), 0.0
            while elapsed < seconds:
                a @ b
                reps += 1
                if reps % 4 == 0 or reps == 1 or device.type == "cpu":
                    sync(device)
                    elapsed = time.perf_counter() - start
            best = max(best, 2 * m * k * n * reps / elapsed)
            if reps == 1:  # one product outlasts a trial
                break
    return best


# ---- data-parallel training under torchrun ----
@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    always: bool = False  # --ddp always: the process group and DDP for one process too

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or self.always

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return self.sum(value) / self.world_size if self.enabled else value

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def any(self, flag: bool, device: torch.device) -> bool:
        if not self.enabled:
            return flag
        return bool(self.sum(torch.tensor(float(flag), device=device)).item() > 0)

    def average(self, tensors: list[torch.Tensor]) -> None:
        if self.enabled:
            for tensor in tensors:
                tensor.div_(self.world_size)
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def first(self, text: str | None) -> str | None:
        """The first rank's text that is not None, on every rank."""
        if not self.enabled:
            return text
        texts: list = [None] * self.world_size
        dist.all_gather_object(texts, text)
        return next((t for t in texts if t is not None), None)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    @contextlib.contextmanager
    def together(self):
        """A UserError on any rank: rank 0 says it and the others leave quietly."""
        error = None
        try:
            yield
        except UserError as err:
            if not self.enabled:
                raise
            error = str(err)
        first = self.first(error)
        if first is not None:
            raise UserError(first) if self.is_main else QuietExit(first)


RANK_ZERO_WAIT = 30.0  # seconds a rank waits for rank 0 to say a mistake


def leave_to_rank_zero(d: Dist, err: UserError) -> None:
    """A mistake on a rank other than 0: wait for torchrun to end it, or say it after RANK_ZERO_WAIT seconds."""

    def ended(signum, frame):
        raise QuietExit(str(err))  # rank 0 has said it

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, ended)
    time.sleep(RANK_ZERO_WAIT)
    if isinstance(err, QuietExit):
        raise err
    raise UserError(f"rank {d.rank}: {err}") from None


def peer_lost(err: BaseException) -> bool:
    backend_error = getattr(dist, "DistBackendError", ())
    return isinstance(err, backend_error) or any(words in str(err) for words in ("closed by peer", "reset by peer"))


def first_line(err: BaseException) -> str:
    """The backend's message without its source path."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return text.split("] ", 1)[-1].split(". ")[0][:160]


def from_environment(ddp: str = "auto") -> Dist:
    """torchrun's RANK, LOCAL_RANK and WORLD_SIZE; a plain run is rank 0 of 1."""
    under_torchrun = "RANK" in os.environ
    if ddp == "always" and not under_torchrun:
        raise UserError("--ddp always: needs torchrun. Run torchrun --standalone --nproc_per_node 1 train.py ...")
    if not under_torchrun or (int(os.environ.get("WORLD_SIZE", "1")) == 1 and ddp != "always"):
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]),
                always=ddp == "always")


def init(d: Dist, device_type: str) -> None:
    """Join the process group: NCCL between GPUs, Gloo on CPUs."""
    if d.enabled and not dist.is_initialized():
        if device_type == "cuda":
            processes = int(os.environ.get("LOCAL_WORLD_SIZE", d.local_rank + 1))
            if processes > torch.cuda.device_count():
                raise UserError(f"torchrun started {processes} processes on this machine, which has "
                                f"{gpus(torch.cuda.device_count())}. Give --nproc_per_node at most "
                                f"{torch.cuda.device_count()}")
            torch.cuda.set_device(d.local_rank)
            dist.init_process_group(backend="nccl", device_id=torch.device("cuda", d.local_rank))
        else:
            dist.init_process_group(backend="gloo")


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
