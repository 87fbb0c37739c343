"""Runtime: the device, the compute dtype, the autocast context and the gradient scaler of a run; and the memory free
for it on this machine."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from configs.choices import DTYPE_NAMES, valid_device
from errors import UserError

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


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
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {spec}: CUDA is not available on this machine (or this PyTorch is a CPU build); "
                        f"use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {spec}: Apple MPS is not available here; use --device cpu")
    return device


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError when RAM runs out."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def cpu_has_bfloat16_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX); elsewhere torch emulates it.

    On a 2-core AMD Zen 4 with AVX512-BF16, bfloat16 products of training-sized matrices (768x128 @ 128x384)
    measured about twice as fast as float32 (278 vs 151 GFLOP/s)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own probes (used by inductor)
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


# On a CPU with bfloat16 units, auto samples a model this large (float32 weights over 16 MB) in bfloat16. Sampling one
# character reads every weight once; below this size they stay in the CPU's caches and float32 kernels win. On this
# project's 2-core AMD EPYC (AVX512-BF16, 32 MB L3), bench_sample.py --dtype float32,bfloat16, 1 row and 8 rows, eager,
# bfloat16 against float32: 2x4x160 (0.6M parameters) 0.61x/0.76x, 4x4x128 0.63x/0.67x, 6x6x192 (2.7M) 0.73x/0.99x,
# 4x4x256 (3.2M) 1.02x/1.42x, 4x4x320 (4.9M) 1.25x/1.43x, 8x8x256 (6.3M) 1.02x/1.22x, 4x4x384 (7.1M) 1.75x/1.62x,
# 6x6x384 (10.7M) 1.47x/1.71x (4 rows).
CPU_BFLOAT16_SAMPLING_PARAMS = 4_000_000


def pick_dtype(spec: str, device: torch.device, sampling: bool = False, params: int = 0) -> torch.dtype:
    """auto: bfloat16 (float16 on older GPUs) on CUDA; bfloat16 on CPUs with bfloat16 units; float32 otherwise.

    Sampling (its weights cast, see weights_for_sampling) with auto on a CPU: bfloat16 only on a CPU with bfloat16
    units and for a model of more than CPU_BFLOAT16_SAMPLING_PARAMS parameters (params); float32 otherwise. Without
    such units, on a 2-core AMD EPYC, bfloat16 weights sampled one stream 1.3x faster but a batch of 8 rows 0.4-0.6x
    as fast, for the 6x6x384 model and the CPU default's 2x4x160 alike, and float16 one stream 1.4-1.5x for the first
    and 0.9x for the second (scripts/bench_sample.py --dtype float32,bfloat16,float16). Asked for by name, sampling
    may use float16 on a CPU too: it needs no autocast there."""
    if spec == "auto":
        if device.type == "cuda":
            # bfloat16 where the GPU has it (compute capability 8 and up); is_bf16_supported() by default also says
            # yes where torch only emulates it (V100, T4), which is slow: float16 with the scaler there
            return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
        large = params > CPU_BFLOAT16_SAMPLING_PARAMS  # sampling: see CPU_BFLOAT16_SAMPLING_PARAMS
        if device.type == "cpu" and cpu_has_bfloat16_units() and (not sampling or large):
            return torch.bfloat16
        return torch.float32
    if spec not in DTYPES:
        raise UserError(f"--dtype {spec}: must be auto, {', '.join(DTYPES)}")
    if spec == "float16" and device.type == "cpu" and not sampling:  # sampling casts the weights: no autocast
        raise UserError("--dtype float16: not supported on CPU; use float32 or bfloat16")
    return DTYPES[spec]


def for_sampling(rt: Runtime, dtype_spec: str, params: int = 0) -> Runtime:
    """The runtime scripts/sample.py uses on rt's device for this --dtype and a model of params parameters (auto on
    a CPU: float32, or bfloat16 for a large model on a CPU with bfloat16 units; see pick_dtype)."""
    return Runtime(rt.device, pick_dtype(dtype_spec, rt.device, sampling=True, params=params))


def weights_for_sampling(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """model with its weights cast, once, to the dtype it samples in; it then decodes without autocast.

    Under autocast the float32 weights stay float32 and every new character reads and casts all of them again:
    one character of the 6x6x384 model reads 42 MB of float32 weights, but 21 MB once they are bfloat16, which
    is what a decoding step's time follows (on a 2-core AMD EPYC without bfloat16 units, the 24 matrix-vector
    products of a step took 4.2 ms in float32 and 1.7 ms in bfloat16). Casts model in place (float32: untouched)."""
    return model if dtype == torch.float32 else model.to(dtype)


def setup(device_spec: str, dtype_spec: str, num_threads: int = 0, local_rank: int = 0,
          sampling: bool = False) -> Runtime:
    device = pick_device(device_spec)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # under torchrun: one GPU per process on this node
    if num_threads:
        torch.set_num_threads(num_threads)
    if device.type == "cuda":
        # The process's current device is the run's (cuda:1 asked for in one process, too): what takes no device
        # argument (the RNG state saved and restored, streams and events, is_bf16_supported) then means this one.
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 tensor cores for any float32 matmuls left
        torch.backends.cudnn.allow_tf32 = True
    return Runtime(device, pick_dtype(dtype_spec, device, sampling))


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
