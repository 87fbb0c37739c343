"""Ctrl-C, SIGTERM, SIGHUP and a closed output for a whole command: abort what has nothing to save, finish a step and
save what has."""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, TextIO

from errors import Interrupted


class GuardedOutput:
    """sys.stdout or sys.stderr, except that a write that fails (a pipe whose reader has gone: `python train.py |
    tee log` and then Ctrl-C, which ends tee too, or `| head`; a terminal that has closed) sends this and later
    output to /dev/null and calls gone(), where it would have raised an error in the middle of the run."""

    def __init__(self, stream: TextIO, gone: Callable[[], None]):
        self._stream, self._gone = stream, gone

    def _guarded(self, method: str, *args):
        try:
            return getattr(self._stream, method)(*args)
        except OSError:  # EPIPE, EIO (the terminal closed), ...
            self._stream = open(os.devnull, "w", encoding="utf-8")
            self._gone()
            return None

    def write(self, text: str):
        return self._guarded("write", text)

    def flush(self) -> None:
        self._guarded("flush")

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


class StopRequest:
    """The first Ctrl-C (or SIGTERM, or SIGHUP: the terminal closed) either aborts at once, while nothing is worth
    saving yet (preparing data, building the model: `saving` is False), or asks the loop to stop at the next step
    boundary and save (`saving` True). It is acknowledged at once on stderr. Another one, a second or more later,
    stops at once. Under torchrun a Ctrl-C reaches each process twice within milliseconds (from the terminal and
    forwarded by torchrun): that is still one request.

    An output that can take no more (its reader gone, its terminal closed) is a request too, once: the run saves and
    ends rather than training on unseen, or dying at its next line with its last steps unsaved. Outside a `with`
    block (tests calling train() in-process) it is a flag nobody sets."""

    GRACE_SECONDS = 1.0

    def __init__(self, speak: bool = True):
        self.speak = speak  # under torchrun only rank 0 acknowledges
        self.requested = False
        self.saving = False
        self.step: int | None = None  # the step the loop is at, for the acknowledgement
        self.agree_every = 1  # under torchrun the processes agree to stop every log_interval steps
        self.ending: str | None = None  # what a request ends instead, once the steps are over (the final validation)
        self.saved = "no checkpoint of this run was written"  # what survives a stop at once
        self.first_at = 0.0
        self.previous: dict = {}
        self.streams: tuple = ()  # sys.stdout and sys.stderr as they were before the block

    def __enter__(self) -> "StopRequest":
        signals = [signal.SIGINT, signal.SIGTERM]
        hangup = getattr(signal, "SIGHUP", None)  # the terminal closed (an ssh connection dropped); POSIX only
        if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:  # under nohup it stays ignored
            signals.append(hangup)
        for sig in signals:
            self.previous[sig] = signal.signal(sig, self.handle)
        self.streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = (GuardedOutput(stream, self.output_gone) for stream in self.streams)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}
        sys.stdout, sys.stderr = self.streams

    def say(self, text: str) -> None:
        if self.speak:
            try:
                os.write(2, f"\n{text}\n".encode())  # a signal handler must not go through Python's buffered streams
            except OSError:  # no reader left (the pipeline's other end got the Ctrl-C too): the stop goes on unsaid
                pass

    def output_gone(self) -> None:
        """The output can take no more: the first time, a stop as by Ctrl-C; never a second, "at once" one."""
        if not self.requested:
            self.handle(0, None)  # (which signal is not read)

    def handle(self, signum, frame) -> None:
        if self.requested:
            if time.monotonic() - self.first_at >= self.GRACE_SECONDS:
                raise Interrupted(f"stopped at once; {self.saved}")
            return
        self.requested, self.first_at = True, time.monotonic()
        if not self.saving:
            raise Interrupted(f"stopped before training began; {self.saved}")
        if self.step is None:
            doing = "finishing the next step"
        elif self.agree_every > 1:  # the step at which the processes next ask each other
            doing = f"training on to step {(self.step // self.agree_every + 1) * self.agree_every}, where the processes stop together"
        else:
            doing = f"finishing step {self.step}"
        doing = self.ending or f"{doing}, then saving ckpt_last.pt"
        self.say(f"stopping: {doing} (press Ctrl-C again to stop at once)")
