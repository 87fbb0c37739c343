"""The stop request: Ctrl-C, SIGTERM, SIGHUP or a closed output, turned into a stop at a step and a save."""
from __future__ import annotations

import contextlib
import os
import signal
import time

from errors import Interrupted
from training.checkpoint import Progress


OUTPUT_GONE = 0  # the "signal" of a stop that output_gone() makes (no signal has the number 0)


class StopRequest:
    """A stop: the loop stops at a step and saves. Another, GRACE_SECONDS later, stops at once."""

    GRACE_SECONDS = 1.0

    def __init__(self, speak: bool = True):
        self.speak = speak  # under torchrun only rank 0 acknowledges
        self.requested = False
        self.progress: Progress | None = None  # set once the loop runs: a stop then saves
        self.agree_every = 1  # under torchrun the processes agree to stop every log_interval steps
        self.undo = False
        self.ending: str | None = None  # what a stop ends instead of the steps
        self.saved = "no checkpoint of this run was written"  # what survives a stop at once, and its command:
        self.resume = ""
        self.first_at = 0.0
        self.previous: dict = {}

    def __enter__(self) -> "StopRequest":
        signals = [signal.SIGINT, signal.SIGTERM]
        hangup = getattr(signal, "SIGHUP", None)  # the terminal closed; POSIX only
        if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:  # under nohup it stays ignored
            signals.append(hangup)
        for sig in signals:
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def training(self, progress: Progress, agree_every: int, undo: bool = False) -> None:
        self.progress, self.agree_every, self.undo = progress, agree_every, undo

    def say(self, text: str) -> None:
        if self.speak:
            with contextlib.suppress(OSError):  # no reader left
                os.write(2, f"\n{text}\n".encode())  # unbuffered, in a signal handler

    def output_gone(self) -> None:
        if not self.requested:
            self.handle(OUTPUT_GONE, None)

    def handle(self, signum, frame) -> None:
        resume = f". Continue with: {self.resume}" if self.resume else ""
        if self.requested:
            if time.monotonic() - self.first_at >= self.GRACE_SECONDS:
                raise Interrupted(f"stopped at once; {self.saved}{resume}")
            return
        self.requested, self.first_at = True, time.monotonic()
        # a stop nobody typed at this terminal says why it came
        why = {OUTPUT_GONE: "the output's reader has gone (a closed pipe or terminal): ",
               signal.SIGTERM: "SIGTERM (a request to end the process): ",
               getattr(signal, "SIGHUP", None): "the terminal closed (SIGHUP): "}.get(signum, "")
        if self.progress is None:
            raise Interrupted(f"{why}stopped before training began; {self.saved}{resume}")
        step = self.progress.it
        if self.agree_every > 1:  # the step at which the processes next ask each other
            together = (step // self.agree_every + 1) * self.agree_every
            doing = f"training on to step {together}, where the processes stop together"
        else:
            done = f"step {step} is done" if step else "no step is done yet"
            step_under_way = ("is undone, or finishes if in its last micro-batch" if self.undo else "finishes first")
            doing = f"{done}; a step under way {step_under_way} (an evaluation stops between batches)"
        doing = self.ending or f"{doing}, then saving ckpt_last.safetensors"
        self.say(f"{why}stopping: {doing} (press Ctrl-C again to stop at once)")
