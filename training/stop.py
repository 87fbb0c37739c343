"""Ctrl-C and SIGTERM for a whole command: abort what has nothing to save, finish a step and save what has."""
from __future__ import annotations

import os
import signal
import time

from errors import Interrupted


class StopRequest:
    """The first Ctrl-C (or SIGTERM) either aborts at once, while nothing is worth saving yet (preparing data, building
    the model: `saving` is False), or asks the loop to stop at the next step boundary and save (`saving` True). It is
    acknowledged at once on stderr. Another one, a second or more later, stops at once. Under torchrun a Ctrl-C reaches
    each process twice within milliseconds (from the terminal and forwarded by torchrun): that is still one request.

    Outside a `with` block (tests calling train() in-process) it is a flag nobody sets."""

    GRACE_SECONDS = 1.0

    def __init__(self, speak: bool = True):
        self.speak = speak  # under torchrun only rank 0 acknowledges
        self.requested = False
        self.saving = False
        self.step: int | None = None  # the step the loop is at, for the acknowledgement
        self.ending: str | None = None  # what a request ends instead, once the steps are over (the final validation)
        self.saved = "no checkpoint of this run was written"  # what survives a stop at once
        self.first_at = 0.0
        self.previous: dict = {}

    def __enter__(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def say(self, text: str) -> None:
        if self.speak:
            os.write(2, f"\n{text}\n".encode())  # a signal handler must not go through Python's buffered streams

    def handle(self, signum, frame) -> None:
        if self.requested:
            if time.monotonic() - self.first_at >= self.GRACE_SECONDS:
                raise Interrupted(f"stopped at once; {self.saved}")
            return
        self.requested, self.first_at = True, time.monotonic()
        if not self.saving:
            raise Interrupted(f"stopped before training began; {self.saved}")
        where = f"step {self.step}" if self.step is not None else "the next step"
        doing = self.ending or f"finishing {where}, then saving ckpt_last.pt"
        self.say(f"stopping: {doing} (press Ctrl-C again to stop at once)")
