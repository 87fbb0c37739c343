"""The training clock: it runs only during training steps (evaluations, samples, pictures and checkpoints are not
training), so tokens/s and MFU describe the steps alone; it also times a session's first step on its own."""
from __future__ import annotations

import time

import torch

from training.build import Progress
from training.perf import sync
from training.phases import Phases


class TrainClock:
    def __init__(self, progress: Progress, device: torch.device, phases: Phases):
        self.progress, self.device, self.phases = progress, device, phases
        self.started = time.perf_counter()
        self.logged = (progress.it, progress.train_seconds)  # (step, training seconds) at the last log line
        self.first_step = progress.it + 1
        self.trained_before = progress.train_seconds

    def stop(self) -> None:
        """Add the stretch since the last start to the run's training seconds (waiting for the device first)."""
        sync(self.device)
        self.progress.train_seconds += time.perf_counter() - self.started
        self.phases.seconds["training steps"] = self.progress.train_seconds - self.trained_before

    def start(self) -> None:
        self.started = time.perf_counter()

    def stepped(self) -> None:
        """After a step: this session's first one (on a GPU, the compilation) is timed alone, with one wait for it."""
        if self.progress.it == self.first_step:
            sync(self.device)
            self.phases.first_step = time.perf_counter() - self.started

    def step_seconds(self) -> float:
        """Seconds per training step since the last call (at a log line, where the loop waits for the device)."""
        seconds = self.progress.train_seconds + time.perf_counter() - self.started
        per_step = max(seconds - self.logged[1], 1e-9) / (self.progress.it - self.logged[0])
        self.logged = (self.progress.it, seconds)
        return per_step
