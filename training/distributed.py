"""Data-parallel training under torchrun: who this process is, the process group, and averaging across ranks."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from errors import QuietExit, UserError


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The average of a tensor over all ranks (itself when running alone)."""
        return self.sum(value) / self.world_size

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
        if not self.enabled:
            return
        errors: list = [None] * self.world_size
        dist.all_gather_object(errors, error)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise UserError(first) if self.is_main else QuietExit(first)


RANK_ZERO_WAIT = 30.0  # seconds a rank waits for rank 0 to say a mistake and leave


def leave_to_rank_zero(d: Dist, err: UserError) -> None:
    """A mistake under torchrun, on a rank other than 0: rank 0 says it. Every rank usually meets the same one, so
    this one waits, silent, for torchrun to end it once rank 0 has spoken and left (had it left first, torchrun could
    stop rank 0 before it spoke: one rank can reach a mistake seconds before another, e.g. while a GPU driver starts).
    A mistake rank 0 has not met (it has not left after RANK_ZERO_WAIT seconds) is said by this rank."""

    def ended(signum, frame):
        raise QuietExit(str(err))  # torchrun ends this rank (SIGTERM), or a Ctrl-C: rank 0 has said it

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, ended)
    time.sleep(RANK_ZERO_WAIT)
    if isinstance(err, QuietExit):  # distributed.together() told every rank: rank 0 has it
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


def from_environment() -> Dist:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE; a plain `python train.py` is rank 0 of 1."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Dist()
    return Dist(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))


def init(d: Dist, device_type: str) -> None:
    """Join the process group: NCCL between GPUs, Gloo on CPUs."""
    if d.enabled and not dist.is_initialized():
        if device_type == "cuda":
            torch.cuda.set_device(d.local_rank)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
