"""The device a run computes on: device and precision (autocast, gradient scaler), CPU threads (measured, and a watch
on steps that slow down), free memory and memory kept for reuse on a CPU, torch.compile with its fallback,
performance figures (FLOPs, peak rate, MFU), and data-parallel training under torchrun."""
from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import platform
import signal
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from configs.choices import DTYPE_NAMES, valid_device
from errors import QuietExit, StepAbandoned, UserError, in_one_line
from model.config import ModelConfig
from model.gpt import GPT

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


# ---- device and precision --------------------------------------------------------------------------------------------
@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # what matrix products run in (autocast); weights and optimizer stay float32

    @property
    def device_type(self) -> str:
        return self.device.type

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """float16 needs loss scaling so small gradients do not underflow; bfloat16 and float32 do not."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)

    def describe(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device_type == "cuda" else self.device_type
        return f"{name}, {str(self.dtype).removeprefix('torch.')}"


def pick_device(spec: str) -> torch.device:
    if not valid_device(spec):
        raise UserError(f"--device {spec}: must be auto, cpu, cuda, cuda:N or mps")
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(spec)
    if reason := unavailable(device):
        fix = ("give one of them, or --device cuda" if device.type == "cuda" and torch.cuda.is_available() else
               "use --device cpu")
        raise UserError(f"--device {spec}: {reason}; {fix}")
    return device


def usable_device(device: torch.device | str, doing: str, fix: str) -> torch.device:
    """device as a torch.device where this machine has it, else one line: 'cannot {doing} {device}: why; {fix}' (the
    Python API's and the checkpoint loader's check; the scripts' --device is pick_device's)."""
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"cannot {doing} {device!r}: not a device; give cpu, cuda, cuda:N or mps") from None
    if reason := unavailable(target):
        raise UserError(f"cannot {doing} {target}: {reason}; {fix}") from None
    return target


def unavailable(device: torch.device) -> str | None:
    """Why this machine has no such device (None where it has it)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine (or this PyTorch is a CPU build)"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "Apple MPS is not available here"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return f"this machine has {gpus(torch.cuda.device_count())}"
    return None


def gpus(count: int) -> str:
    """'1 GPU (cuda:0)', '4 GPUs (cuda:0 to cuda:3)'."""
    return "1 GPU (cuda:0)" if count == 1 else f"{count} GPUs (cuda:0 to cuda:{count - 1})"


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError when RAM runs out."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def cpu_has_bfloat16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX); elsewhere torch emulates it."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own probes (used by inductor)
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def native_bfloat16(device_type: str) -> bool:
    """Whether the device multiplies bfloat16 matrices in hardware (a GPU of compute capability 8 and up, a CPU with
    bfloat16 units); where torch only emulates it (a V100 or T4, though is_bf16_supported() says yes) it is slow."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device_type == "cpu" and cpu_has_bfloat16_units()


# Above this many parameters (16 MB of float32), auto samples in bfloat16 on a CPU with bfloat16 units: a character
# reads every weight once, and a smaller model stays in the CPU's caches, where float32 is faster (docs/speed.md).
CPU_BFLOAT16_SAMPLING_PARAMS = 4_000_000


def pick_dtype(spec: str, device: torch.device, sampling: bool = False, params: int = 0) -> torch.dtype:
    """auto: bfloat16 (float16 on older GPUs) on CUDA; bfloat16 on CPUs with bfloat16 units; float32 otherwise.
    Sampling casts the weights once (`model.to(dtype)`, no autocast), so it may use float16 on a CPU, and with auto
    takes bfloat16 there only above CPU_BFLOAT16_SAMPLING_PARAMS parameters (params). UserError for an unknown dtype,
    or float16 training on a CPU."""
    if spec == "auto":
        if device.type == "cuda":  # float16 with the scaler where bfloat16 is only emulated
            return torch.bfloat16 if native_bfloat16("cuda") else torch.float16
        large = params > CPU_BFLOAT16_SAMPLING_PARAMS
        if device.type == "cpu" and native_bfloat16("cpu") and (not sampling or large):
            return torch.bfloat16
        return torch.float32
    if spec not in DTYPES:
        raise UserError(f"--dtype {spec}: must be auto, {', '.join(DTYPES)}")
    if spec == "float16" and device.type == "cpu" and not sampling:
        raise UserError("--dtype float16: not supported on CPU; use float32 or bfloat16")
    return DTYPES[spec]


def for_sampling(rt: Runtime, dtype_spec: str, params: int = 0) -> Runtime:
    """The runtime scripts/sample.py uses on rt's device for this --dtype and a model of params parameters."""
    return Runtime(rt.device, pick_dtype(dtype_spec, rt.device, sampling=True, params=params))


def setup(device_spec: str, dtype_spec: str, num_threads: int = 0, local_rank: int = 0,
          sampling: bool = False) -> Runtime:
    device = pick_device(device_spec)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # under torchrun: one GPU per process on this node
    if num_threads:
        torch.set_num_threads(num_threads)
    if device.type == "cpu":
        keep_freed_memory()
    if device.type == "cuda":
        # Made current (cuda:1 too), so what takes no device argument (RNG state, streams, is_bf16_supported) means it.
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 tensor cores for any float32 matmuls left
        torch.backends.cudnn.allow_tf32 = True
    return Runtime(device, pick_dtype(dtype_spec, device, sampling))


# ---- CPU threads: measured on the machine as it is -------------------------------------------------------------------
def cores() -> int:
    """The cores this process may use: its affinity (taskset's, a container's), up to cgroup v2's cpu.max rounded up."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]  # "max 100000" where there is none
        if quota != "max":
            count = min(count, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(count, 1)


def thread_counts(n_cores: int) -> list[int]:
    """The intra-op thread counts tried on n_cores cores, most first: all, then halving down to one (6: 6, 3, 1)."""
    counts = [n_cores]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


FAR_SLOWER = 3.0  # a count whose first (cold) call is this many times one thread's warm call is not tried further
CLEARLY_SLOWER = 1.5  # a count whose fastest warm call is this many times the leader's median is tried no further
PROBE_ROUNDS = 3  # warm calls per count
PROBE_BUDGET = 4.0  # seconds of calls after which no further round begins, once the leader has two


def measure_threads(time_once: Callable[[], float], counts: list[int], rounds: int = PROBE_ROUNDS,
                    budget: float = PROBE_BUDGET) -> dict[int, list[float]]:
    """Seconds of the same work (time_once() does it once, returns its seconds) at each of counts (most first), warm
    calls only: the first call at the fewest threads, and each other count's first (its threads start), pay one-off
    costs and are not counted, and a count whose first is FAR_SLOWER than a warm call at the fewest is not tried again.
    The rest take turns, round by round, so that a change in load falls on each alike, and after each round any
    CLEARLY_SLOWER than the fastest is dropped, until each left has `rounds` warm calls or the calls took `budget`
    seconds and the fastest has two. Returns the counted calls (a count not tried again: its cold call); the thread
    count is left at the last one timed."""
    fewest, spent = counts[-1], 0.0
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    torch.set_num_threads(fewest)
    time_once()
    seconds[fewest].append(time_once())
    alive = [fewest]
    for n in reversed(counts[:-1]):
        torch.set_num_threads(n)
        first = time_once()
        spent += first
        if first > FAR_SLOWER * seconds[fewest][0]:
            seconds[n].append(first)
        else:
            alive.insert(0, n)
    while True:
        for n in alive:
            if len(seconds[n]) < rounds:
                torch.set_num_threads(n)
                seconds[n].append(time_once())
                spent += seconds[n][-1]
        leader = fastest({n: seconds[n] for n in alive})
        alive = [n for n in alive if min(seconds[n]) < CLEARLY_SLOWER * statistics.median(seconds[leader])]
        if all(len(seconds[n]) >= rounds for n in alive) or (spent >= budget and len(seconds[leader]) >= 2):
            return {n: times for n, times in seconds.items() if times}


def fastest(seconds: dict[int, list[float]]) -> int:
    """The count whose median time is lowest; of two alike, the fewer threads, which leaves the machine more room."""
    return min(seconds, key=lambda n: (statistics.median(seconds[n]), n))


@dataclass
class Threads:
    """The intra-op thread count, why, and the seconds of each count's warm calls (empty where none was timed)."""
    count: int
    why: str  # "measured", "asked" (--num_threads), "kept" (a resumed run's own), "OMP_NUM_THREADS", "one core"
    seconds: dict[int, list[float]]

    @property
    def steady(self) -> list[float]:
        """The timed calls at the chosen count."""
        return self.seconds.get(self.count, [])

    def line(self, work: str) -> str:
        """What a command says of its threads: the count, why, and what the work (e.g. "a step") took at each count."""
        each = [f"{span(self.seconds[n])} with {n}" for n in sorted(self.seconds, reverse=True)]
        timed = "; ".join(each) if len(each) > 1 else span(self.steady) if self.steady else ""
        if self.why == "measured":
            return (f"threads: {self.count} of {cores()} cores, the faster just now ({work}: {timed}); "
                    f"--num_threads N sets the count")
        reason = {"asked": f"--num_threads {self.count}", "OMP_NUM_THREADS": "OMP_NUM_THREADS",
                  "one core": "this process may use one core",
                  "kept": "this run's own, kept on resume so that it goes on as it began; --num_threads 0 measures "
                          "again"}[self.why]
        n_cores, fix = cores(), {"asked": " (--num_threads 0 measures)",
                                 "OMP_NUM_THREADS": " (unset OMP_NUM_THREADS, or give --num_threads N)"}
        over = (f"; more than the {n_cores} core{'s' * (n_cores != 1)} this process may use, so they wait on each "
                f"other: {n_cores} or fewer is faster{fix.get(self.why, '')}" if self.count > n_cores else "")
        return f"threads: {self.count} ({reason})" + (f"; {work}: {timed}" if timed else "") + over


def span(seconds: list[float]) -> str:
    """'41 ms' or '41-47 ms' (the times differ), '5.4 s', '12-30 s': the range of a few timings, as read."""
    low, high = min(seconds), max(seconds)
    if high < 1:
        scale, unit, digits = 1000, "ms", 0
    else:
        scale, unit, digits = 1, "s", 1 if high < 10 else 0
    low_text, high_text = f"{low * scale:.{digits}f}", f"{high * scale:.{digits}f}"
    return f"{low_text} {unit}" if low_text == high_text else f"{low_text}-{high_text} {unit}"


def choose_threads(asked: int, time_once: Callable[[], float] | None, timed: bool = False) -> Threads:
    """Set and return the thread count for CPU work: asked (--num_threads), else OMP_NUM_THREADS (torchrun sets it for
    several processes), else 1 on one core, else the fastest of thread_counts(cores()) for time_once, measured now. A
    given count is never measured against another (the count changes a run's last digits); timed still times it."""
    if asked:
        counts, why = [asked], "asked"
    elif os.environ.get("OMP_NUM_THREADS"):
        counts, why = [torch.get_num_threads()], "OMP_NUM_THREADS"
    elif cores() == 1:
        counts, why = [1], "one core"
    else:
        counts, why = thread_counts(cores()), "measured"
    seconds = measure_threads(time_once, counts) if time_once is not None and (timed or len(counts) > 1) else {}
    count = fastest(seconds) if len(seconds) > 1 else counts[0]
    torch.set_num_threads(count)
    return Threads(count, why, seconds)


SLOWDOWN = 3.0  # steps this many times as long as those timed before the first step: the machine got busier
SLOW_FOR = 20.0  # seconds of such steps in one log interval: said at once, without waiting for the next line


class SlowdownWatch:
    """Steps over `limit` (SLOWDOWN times those timed before the first step) at two log lines in a row, or through a
    log interval of SLOW_FOR seconds, mean other work shares the CPU: said once, advising fewer threads by a resume
    (`advice` keeps the flag for the stopped line), as a run changing its own count would change its last digits."""

    def __init__(self, step_seconds: float, threads: int, resume: str):
        self.step_seconds, self.threads, self.resume = step_seconds, threads, resume
        self.limit = SLOWDOWN * step_seconds
        self.last_slow, self.said, self.advice = None, False, ""  # the step of the last slow log line

    def seen(self, previous: int, it: int, step_seconds: float) -> str | None:
        """Called at step `it`'s log line only when its steps are slow (previous: the step of the line before): the
        note, the first time two lines in a row were slow or one interval lasted SLOW_FOR seconds; None otherwise."""
        in_a_row, self.last_slow = self.last_slow == previous, it
        if self.said or not (in_a_row or step_seconds * (it - previous) >= SLOW_FOR):
            return None
        self.said = True
        times = f"{step_seconds / self.step_seconds:.1f}x"
        said = (f"note: steps now take {span([step_seconds])}, {times} the {span([self.step_seconds])} timed before "
                f"the first step: other work is likely using the CPU")
        if self.threads == 1:
            return said + "; this run uses one thread already, so it goes on as fast as the machine lets it"
        self.advice = f"--num_threads {max(1, self.threads // 2)}"
        return (f"{said}, and {self.threads} threads wait on each other when a core is taken; with fewer it may go "
                f"faster: Ctrl-C (it saves), then {self.resume} {self.advice}")


# glibc's malloc.h: free heap top kept before it is trimmed; size from which a block is mapped (unmapped when freed).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Linux with glibc: keep memory the process frees (blocks up to KEPT_BYTES) for its next request, since a step
    frees and allocates the same megabyte tensors every time, which glibc would hand back and fault in afresh
    (docs/speed.md has the count); the peak does not grow. True if set; False elsewhere (macOS, Windows, musl)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    # Setting the map threshold stops glibc raising either threshold by itself, so both are set. mallopt(3) documents
    # 32 MiB as the highest on 64-bit systems, but glibc 2.36 takes 1 GiB: where 1 GiB is refused, 32 MiB.
    mapped = mallopt(M_MMAP_THRESHOLD, KEPT_BYTES) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mapped and mallopt(M_TRIM_THRESHOLD, KEPT_BYTES))


def free_memory() -> int | None:
    """Bytes this machine can still give a process without ending one (Linux: MemAvailable plus free swap, and no
    more than a container's own limit allows, cgroup v2); None where the system does not say."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        free = sum(int(fields[name].split()[0]) * 1024 for name in ("MemAvailable", "SwapFree") if name in fields)
    except (OSError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()  # "max" where there is none
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return free


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ---- torch.compile ---------------------------------------------------------------------------------------------------
def compile_wanted(setting: str, device_type: str) -> bool:
    """--compile true, or auto on CUDA."""
    return setting == "true" or (setting == "auto" and device_type == "cuda")


class BlocksCompiled:
    """A view of a GPT sharing its parameters, buffers and submodules, but with torch.compile'd copies of its `blocks`:
    they have the same code and shapes, so one graph compiles and every layer runs it ("regional compilation", faster
    to compile than the whole model). The model is untouched (sampling, checkpoints); uncompile() unwraps the view."""

    def __init__(self, model: GPT, mode: str | None):
        self.plain = model.blocks
        self.view = copy.copy(model)  # a shallow copy: it shares every parameter, buffer and submodule ...
        self.view._modules = dict(model._modules)  # ... except the list of blocks, replaced below
        self.view._modules["blocks"] = nn.ModuleList(torch.compile(block, mode=mode) for block in model.blocks)

    def uncompile(self) -> None:
        self.view._modules["blocks"] = self.plain


DEVICE_ERRORS = (torch.AcceleratorError,) if hasattr(torch, "AcceleratorError") else ()  # CUDA errors
COMPILE_FAILED = "warning: torch.compile failed ({}); continuing without it (--compile false skips the attempt)"


class CompileFallback:
    """Calls `compiled` until it fails with the compiler's error (compiling happens at first use); then warns once,
    calls `uncompile` (what the caller undoes and records), and sends the failed call and all later ones to `module`,
    as it does every other attribute."""

    def __init__(self, module, compiled: Callable, say=print, uncompile: Callable[[], None] = lambda: None):
        self.module, self.compiled, self.say, self.uncompile = module, compiled, say, uncompile
        # AOTAutograd compiles the backward lazily, at the first .backward(), outside this call: the training step hands
        # that one to first_compiled_backward(). An attribute, not a property: the step reads it every time.
        self.backward_unchecked = True

    @staticmethod
    def compilers(err: Exception) -> bool:
        """Whether err is the compiler's: not out of memory or a broken device, which uncompiled code would meet too."""
        return not (is_out_of_memory(err) or isinstance(err, DEVICE_ERRORS))

    def give_up(self, reason: str) -> None:
        """Compilation off from now on, with the warning that gives reason."""
        self.say(COMPILE_FAILED.format(reason))
        self.compiled, self.backward_unchecked = None, False
        self.uncompile()

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # an inductor or driver problem must not end the run
                if not self.compilers(err):
                    raise  # (the one-line out-of-memory message)
                self.give_up(in_one_line(err))
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def first_compiled_backward(model: CompileFallback, batches, rt: Runtime, d: "Dist",
                            forward_backward: Callable[[], torch.Tensor]) -> torch.Tensor:
    """forward_backward() (the step's micro-batches: returns their mean loss, gradients in .grad) through a compiled
    model whose backward compiles at this first .backward(). If that fails, or the gradients are not finite (inductor's
    bfloat16 code gives NaN on some Intel CPUs; float16's overflow by design while its scaler finds a scale, so are not
    checked), compilation is turned off and the step reruns uncompiled, with the same batches and dropout. Under DDP
    every rank falls back if any does, keeping collectives matched; the pass runs under no_sync, gradients averaged by
    hand: DDP's hooks would start reducing a failed pass's gradients, and its next forward would refuse to start."""
    batches_began, random_began = batches.state_dict(), random_states(rt.device)
    no_sync = model.no_sync if d.enabled else contextlib.nullcontext
    failure = None
    try:
        with no_sync():
            loss = forward_backward()
        if rt.dtype != torch.float16 and not all_finite(p.grad for p in model.parameters()):
            failure = ("its first step's gradients came out NaN or infinite, as torch 2.13's compiled bfloat16 code "
                       "does on some Intel CPUs; that step is computed again uncompiled, so nothing is lost")
    except StepAbandoned:
        raise
    except Exception as err:
        if not model.compilers(err):
            raise
        failure = in_one_line(err)
    if failure is not None and d.world_size > 1:
        failure = f"rank {d.rank}: {failure}"
        # Out of the except block, the failed attempt's traceback and saved activations are freed before the retry.
    failure = d.first(failure)
    model.backward_unchecked = False  # checked now: compiled from here on, or (a failure) uncompiled
    if failure is not None:
        batches.load_state_dict(batches_began)
        set_random_states(rt.device, random_began)
        model.zero_grad(set_to_none=True)
        model.give_up(failure)
        with no_sync():
            loss = forward_backward()
    d.average([p.grad for p in model.parameters() if p.grad is not None])
    return loss


def all_finite(tensors) -> bool:
    """Whether every element of every tensor (None skipped) is finite: one read of the device."""
    flags = [torch.isfinite(t).all() for t in tensors if t is not None]
    return bool(torch.stack(flags).all()) if flags else True


def random_states(device: torch.device) -> tuple:
    """The random streams a step draws from (dropout): the CPU's, and the GPU's on CUDA."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_random_states(device: torch.device, states: tuple) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], device)


AUTOTUNE_TABLES = {"autotune_num_choices_displayed": ("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", 0),
                   "max_autotune_report_choices_stats": ("TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS", False)}


def quiet_autotuning() -> None:
    """A max-autotune mode's compiling without torch's asides among the run's lines: inductor writes a table of kernel
    timings for each matrix product it tunes (250 lines for a 2-layer model), kept where its environment variable asks
    for it (AUTOTUNE_TABLES); and its autotuner calls torch's own deprecated TypedStorage (torch 2.11 and 2.13), whose
    UserWarning is hidden where a module of torch's raises it, and only there."""
    from torch._inductor import config
    for name, (variable, quiet) in AUTOTUNE_TABLES.items():
        if variable not in os.environ and hasattr(config, name):
            setattr(config, name, quiet)
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, r"torch\.")


def step_and_eval_models(model: GPT, wrap: Callable[[nn.Module], nn.Module], setting: str, device_type: str,
                         mode: str = "default", scope: str = "blocks", compile_eval: bool = True, say=print,
                         gave_up: Callable[[], None] = lambda: None):
    """The models the training step and evaluations call; wrap adds what the step needs (DDP). Where compile_wanted,
    scope "blocks" compiles each block (BlocksCompiled), "model" the whole model; mode is torch.compile's
    (configs.choices.COMPILE_MODES, none replaying CUDA graphs); compile_eval false evaluates the plain model.
    gave_up() is called once if compilation fails, at once or at first use (CompileFallback)."""
    if not compile_wanted(setting, device_type):
        step_model = wrap(model)
        return step_model, step_model
    mode_arg = None if mode == "default" else mode
    if mode.startswith("max-autotune"):
        quiet_autotuning()
    # torch.compile may refuse at once (say, a Python dynamo does not support yet): only a warning. Only the compiling
    # is inside the try, so that a failure of the DDP wrapping is never called a compile failure.
    if scope == "model":  # the whole model is compiled with its DDP wrapper
        step_model = wrap(model)
        try:
            whole = torch.compile(step_model, mode=mode_arg)
        except RuntimeError as err:
            say(COMPILE_FAILED.format(in_one_line(err)))
            gave_up()
            return step_model, step_model
        compiled = CompileFallback(step_model, whole, say, gave_up)
    else:
        try:
            blocks = BlocksCompiled(model, mode_arg)
        except RuntimeError as err:
            say(COMPILE_FAILED.format(in_one_line(err)))
            gave_up()
            step_model = wrap(model)
            return step_model, step_model
        step_model = wrap(blocks.view)

        def uncompile() -> None:
            blocks.uncompile()
            gave_up()
        compiled = CompileFallback(step_model, step_model, say, uncompile)
    return compiled, compiled if compile_eval else model


# ---- performance figures ---------------------------------------------------------------------------------------------
def flops_per_token(n_params: int, cfg: ModelConfig) -> float:
    """Training FLOPs per token, the usual estimate: 6 per parameter (forward + backward) plus attention's 12·L·C·T."""
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def measure_peak_flops(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]] = (),
                       seconds: float = 0.03, trials: int = 3) -> float:
    """The best FLOP/s of matrix products in dtype on this device: a large square one and the model's (m, k, n) shapes,
    each the best of `trials` short trials, lest a busy moment lower the ceiling (MFU over 100%); every run pays it.
    The first product of a shape is a warm-up, never timed: on a GPU it carries the library's set-up, which can outlast
    a trial many times over."""
    size = 8192 if device.type == "cuda" else 1024
    gen = torch.Generator(device=device).manual_seed(0)  # leaves the global RNG (dropout, resume) untouched
    best = 0.0
    for m, k, n in [(size, size, size), *shapes]:
        a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
        b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
        a @ b  # warm-up
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        if time.perf_counter() - start >= seconds:  # one product outlasts a trial (bfloat16 emulated on a CPU)
            best = max(best, 2 * m * k * n / (time.perf_counter() - start))
            continue
        for _ in range(trials):
            sync(device)
            reps, start = 0, time.perf_counter()
            while True:
                a @ b
                reps += 1
                if reps % 4 == 0 or device.type == "cpu":  # a GPU is read every few products, a CPU after each
                    sync(device)
                    elapsed = time.perf_counter() - start
                    if elapsed >= seconds:
                        break
            best = max(best, 2 * m * k * n * reps / elapsed)
    return best


# ---- data-parallel training under torchrun ---------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    always: bool = False  # --ddp always: the process group and DDP for one process too

    @property
    def enabled(self) -> bool:
        """Whether the run is data-parallel (a process group, DDP, collectives): 2 or more processes, or one with --ddp
        always. Where only the number of processes matters (RNG streams, plurals), use world_size."""
        return self.world_size > 1 or self.always

    @property
    def backend(self) -> str:
        return dist.get_backend() if dist.is_initialized() else ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The average of a tensor over all ranks (itself when running alone)."""
        return self.sum(value) / self.world_size if self.enabled else value

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when it is true on any: ranks must agree to stop, or the others hang."""
        if not self.enabled:
            return flag
        return bool(self.sum(torch.tensor(float(flag), device=device)).item() > 0)

    def average(self, tensors: list[torch.Tensor]) -> None:
        """Each tensor replaced in place by its average over the ranks, divided then summed as DDP does gradients."""
        if self.enabled:
            for tensor in tensors:
                tensor.div_(self.world_size)
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def first(self, text: str | None) -> str | None:
        """The first rank's text that is not None, on every rank (None when every rank has None)."""
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
        """A stage that any rank may fail with a UserError: at its end every rank learns whether one did, so that
        rank 0 prints that one line and the others leave quietly, instead of their peers' broken connections."""
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


RANK_ZERO_WAIT = 30.0  # seconds a rank waits for rank 0 to say a mistake and leave


def leave_to_rank_zero(d: Dist, err: UserError) -> None:
    """A mistake on a rank other than 0: ranks usually meet the same one, so this one waits silently for torchrun to end
    it once rank 0 has said it (had it left first, torchrun could stop rank 0 before it spoke: ranks can reach a
    mistake seconds apart). If rank 0 has not left after RANK_ZERO_WAIT seconds, this rank says it."""

    def ended(signum, frame):
        raise QuietExit(str(err))  # torchrun ends this rank (SIGTERM), or a Ctrl-C: rank 0 has said it

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, ended)
    time.sleep(RANK_ZERO_WAIT)
    if isinstance(err, QuietExit):  # Dist.together() told every rank: rank 0 has it
        raise err
    raise UserError(f"rank {d.rank}: {err}") from None


def peer_lost(err: BaseException) -> bool:
    """The error a collective raises when another process of the job has died (killed, out of memory): gloo says
    'Connection closed by peer' (a plain RuntimeError), NCCL raises a DistBackendError."""
    backend_error = getattr(dist, "DistBackendError", ())
    return isinstance(err, backend_error) or any(words in str(err) for words in ("closed by peer", "reset by peer"))


def first_line(err: BaseException) -> str:
    """The backend's message without its source path: '[.../gloo/transport/tcp/pair.cc:553] Connection closed ...'."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return text.split("] ", 1)[-1].split(". ")[0][:160]


def from_environment(ddp: str = "auto") -> Dist:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE; a plain `python train.py` is rank 0 of 1. ddp "always" (the
    --ddp setting) makes one torchrun process data-parallel too."""
    under_torchrun = "RANK" in os.environ
    if ddp == "always" and not under_torchrun:
        raise UserError("--ddp always: needs torchrun, which starts the process group's processes; run torchrun "
                        "--standalone --nproc_per_node 1 train.py ..., or leave --ddp out")
    if not under_torchrun or (int(os.environ.get("WORLD_SIZE", "1")) == 1 and ddp != "always"):
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]),
                always=ddp == "always")


def init(d: Dist, device_type: str) -> None:
    """Join the process group: NCCL between GPUs, Gloo on CPUs."""
    if d.enabled and not dist.is_initialized():
        if device_type == "cuda":
            processes = int(os.environ.get("LOCAL_WORLD_SIZE", d.local_rank + 1))  # on this machine (every rank's)
            if processes > torch.cuda.device_count():
                raise UserError(f"torchrun started {processes} processes on this machine, which has "
                                f"{gpus(torch.cuda.device_count())}; give --nproc_per_node at most "
                                f"{torch.cuda.device_count()}")
            torch.cuda.set_device(d.local_rank)
            # bound to its GPU: NCCL forms the communicator now, and a barrier knows its device (else torch warns)
            dist.init_process_group(backend="nccl", device_id=torch.device("cuda", d.local_rank))
        else:
            dist.init_process_group(backend="gloo")


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
