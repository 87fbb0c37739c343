"""The training clock: it runs only during training steps (evaluations, samples, pictures, checkpoints and
torch.compile's work are not training), so tokens/s and MFU describe the steps alone; it also times a session's
first step on its own."""
from __future__ import annotations

import time

import torch

from training.build import Progress
from training.perf import sync
from training.phases import Phases, compile_seconds


class TrainClock:
    def __init__(self, progress: Progress, device: torch.device, phases: Phases):
        self.progress, self.device, self.phases = progress, device, phases
        self.started, self.compiled = time.perf_counter(), compile_seconds()
        self.logged = (progress.it, progress.train_seconds)  # (step, training seconds) at the last log line
        self.first_step = progress.it + 1
        self.trained_before = progress.train_seconds

    def stretch(self) -> float:
        """Seconds since the last start, less what torch.compile took in them."""
        return time.perf_counter() - self.started - (compile_seconds() - self.compiled)

    def stop(self) -> None:
        """Add the stretch since the last start to the run's training seconds (waiting for the device first), and its
        compilation to the phase of that name."""
        sync(self.device)
        self.progress.train_seconds += self.stretch()
        self.phases.seconds["compilation"] += compile_seconds() - self.compiled
        self.phases.seconds["training steps"] = self.progress.train_seconds - self.trained_before

    def start(self) -> None:
        self.started, self.compiled = time.perf_counter(), compile_seconds()

    def stepped(self) -> None:
        """After a step: this session's first one (cuDNN's and cuBLAS's set-up on a GPU) is timed alone, with one wait
        for it."""
        if self.progress.it == self.first_step:
            sync(self.device)
            self.phases.first_step = self.stretch()

    def step_seconds(self) -> float:
        """Seconds per training step since the last call (at a log line, where the loop waits for the device)."""
        seconds = self.progress.train_seconds + self.stretch()
        per_step = max(seconds - self.logged[1], 1e-9) / (self.progress.it - self.logged[0])
        self.logged = (self.progress.it, seconds)
        return per_step
