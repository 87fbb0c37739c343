"""The machine a command computes on: device, precision, CPU threads and free memory."""

import contextlib
import ctypes
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from configs.choices import DTYPE_NAMES, valid_device
from errors import UserError

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype  # of matrix products (autocast); weights and optimizer stay float32

    @property
    def device_type(self) -> str:
        return self.device.type

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """float16 needs loss scaling, or small gradients underflow."""
        return torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)

    def describe(self) -> str:
        name = torch.cuda.get_device_name(self.device) if self.device_type == "cuda" else self.device_type
        return f"{name}, {str(self.dtype).removeprefix('torch.')}"


def pick_device(spec: str) -> torch.device:
    if not valid_device(spec):
        raise UserError(f"--device {spec}: must be auto, cpu, cuda, cuda:N or mps")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    device = torch.device(spec)
    if reason := unavailable(device):
        fix = ("give one of them, or --device cuda" if device.type == "cuda" and torch.cuda.is_available() else
               "use --device cpu")
        raise UserError(f"--device {spec}: {reason}; {fix}")
    return device


def usable_device(device: torch.device | str, doing: str, fix: str) -> torch.device:
    """device as a torch.device; refuses one this machine lacks."""
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"cannot {doing} {device!r}: not a device; give cpu, cuda, cuda:N or mps") from None
    if reason := unavailable(target):
        raise UserError(f"cannot {doing} {target}: {reason}; {fix}") from None
    return target


def unavailable(device: torch.device) -> str | None:
    """Why this machine lacks device, else None."""
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine (or this PyTorch is a CPU build)"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "Apple MPS is not available here"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return f"this machine has {gpus(torch.cuda.device_count())}"
    return None


def gpus(count: int) -> str:
    return "1 GPU (cuda:0)" if count == 1 else f"{count} GPUs (cuda:0 to cuda:{count - 1})"


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError when RAM runs out."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def cpu_has_bfloat16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX)."""
    return any(getattr(torch.cpu, f"_is_{unit}_supported", lambda: False)() for unit in ("avx512_bf16", "amx_tile"))


def native_bfloat16(device_type: str) -> bool:
    """Whether the device multiplies bfloat16 matrices in hardware."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device_type == "cpu" and cpu_has_bfloat16_units()


# auto samples in bfloat16 on a CPU only above this many parameters: smaller models fit the caches.
CPU_BFLOAT16_SAMPLING_PARAMS = 4_000_000


def pick_dtype(spec: str, device: torch.device, sampling: bool = False, params: int = 0) -> torch.dtype:
    """auto: bfloat16 (float16 on older GPUs) on CUDA, bfloat16 on CPUs with bfloat16 units, else float32."""
    if spec == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if native_bfloat16("cuda") else torch.float16
        if device.type == "cpu" and native_bfloat16("cpu") and (not sampling or params > CPU_BFLOAT16_SAMPLING_PARAMS):
            return torch.bfloat16
        return torch.float32
    if spec not in DTYPES:
        raise UserError(f"--dtype {spec}: must be auto, {', '.join(DTYPES)}")
    if spec == "float16" and device.type == "cpu" and not sampling:
        raise UserError("--dtype float16: not supported on CPU; use float32 or bfloat16")
    return DTYPES[spec]


def for_sampling(rt: Runtime, dtype_spec: str, params: int = 0) -> Runtime:
    return Runtime(rt.device, pick_dtype(dtype_spec, rt.device, sampling=True, params=params))


def setup(device_spec: str, dtype_spec: str, num_threads: int = 0, local_rank: int = 0,
          sampling: bool = False) -> Runtime:
    device = pick_device(device_spec)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # under torchrun: one GPU per process
    if num_threads:
        torch.set_num_threads(num_threads)
    if device.type == "cpu":
        keep_freed_memory()
    elif device.type == "cuda":
        torch.cuda.set_device(device)  # the default for calls without a device
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return Runtime(device, pick_dtype(dtype_spec, device, sampling))


# ---- CPU threads
def cores() -> int:
    """The cores this process may use: its affinity, up to cgroup v2's cpu.max."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(count, 1)


def thread_counts(n_cores: int) -> list[int]:
    """All cores, then halving down to one: 6, 3, 1."""
    return [n_cores >> halvings for halvings in range(n_cores.bit_length())]


FAR_SLOWER = 3.0  # a first call this many times one thread's drops its count
CLEARLY_SLOWER = 1.5  # a best call this many times the leader's median drops its count
PROBE_ROUNDS, PROBE_BUDGET = 3, 4.0  # warm calls per count; seconds after which no round begins


def measure_threads(time_once: Callable[[], float], counts: list[int], rounds: int = PROBE_ROUNDS,
                    budget: float = PROBE_BUDGET) -> dict[int, list[float]]:
    """Seconds of warm time_once() calls per count, taken in turns so load falls on each alike."""
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
    """The count of lowest median time; of two alike, the fewer."""
    return min(seconds, key=lambda n: (statistics.median(seconds[n]), n))


@dataclass
class Threads:
    """The thread count chosen, and why."""
    count: int
    why: str  # "measured", "asked", "kept", "OMP_NUM_THREADS", "one core"
    seconds: dict[int, list[float]]

    @property
    def steady(self) -> list[float]:
        return self.seconds.get(self.count, [])

    def line(self, work: str) -> str:
        each = [f"{span(self.seconds[n])} with {n}" for n in sorted(self.seconds, reverse=True)]
        timed = "; ".join(each) if len(each) > 1 else span(self.steady) if self.steady else ""
        n_cores = cores()
        if self.why == "measured":
            return (f"threads: {self.count} of {n_cores} cores, the faster just now ({work}: {timed}); "
                    f"--num_threads N sets the count")
        reason = {"asked": f"--num_threads {self.count}", "one core": "this process may use one core",
                  "kept": "this run's own, kept on resume; --num_threads 0 measures again"}.get(self.why, self.why)
        fix = {"asked": " (--num_threads 0 measures)",
               "OMP_NUM_THREADS": " (unset OMP_NUM_THREADS, or give --num_threads N)"}.get(self.why, "")
        over = (f"; more than the {n_cores} core{'s' * (n_cores != 1)} this process may use: {n_cores} or fewer is "
                f"faster{fix}" if self.count > n_cores else "")
        return f"threads: {self.count} ({reason})" + (f"; {work}: {timed}" if timed else "") + over


def span(seconds: list[float]) -> str:
    """The range of a few timings: '41 ms', '41-47 ms', '5.4 s', '12-30 s'."""
    high = max(seconds)
    scale, unit, digits = (1000, "ms", 0) if high < 1 else (1, "s", int(high < 10))
    low_text, high_text = (f"{x * scale:.{digits}f}" for x in (min(seconds), high))
    return f"{low_text} {unit}" if low_text == high_text else f"{low_text}-{high_text} {unit}"


def choose_threads(asked: int, time_once: Callable[[], float] | None, timed: bool = False) -> Threads:
    """Set the thread count: asked, else OMP_NUM_THREADS, else 1 on one core, else the fastest measured now."""
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


# glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """glibc: keep freed blocks up to KEPT_BYTES, as each step frees and allocates the same tensors."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # where 1 GiB is refused, 32 MiB (mallopt(3)'s highest on 64-bit systems)
    mapped = mallopt(M_MMAP_THRESHOLD, KEPT_BYTES) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mapped and mallopt(M_TRIM_THRESHOLD, KEPT_BYTES))


def free_memory() -> int | None:
    """Bytes a process can still get (Linux: MemAvailable plus free swap, within cgroup v2), else None."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        free = sum(int(fields[name].split()[0]) * 1024 for name in ("MemAvailable", "SwapFree") if name in fields)
    except (OSError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return free


def check_free_memory(need: int, device: torch.device | str, what: str, fix: str, error: type = UserError) -> None:
    """On a CPU, refuse what needs more than the free memory: the system would kill the process silently."""
    free = free_memory() if torch.device(device).type == "cpu" else None
    if free is not None and need > free:
        raise error(f"out of memory: {what} would need about {need / 2**30:.1f} GiB, and this machine has "
                    f"{free / 2**30:.1f} GiB free; {fix}")


@contextlib.contextmanager
def fits_in_memory(need: int, device: torch.device | str, what: str, fix: str, error: type = UserError):
    """check_free_memory, then a failed allocation raises the same error."""

    check_free_memory(need, device, what, fix, error)
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        if isinstance(err, RuntimeError) and not is_out_of_memory(err):
            raise
        raise error(f"out of memory: {what} do not fit on {torch.device(device).type}; {fix}") from None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
