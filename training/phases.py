"""Where a run's time goes: seconds for each phase of the whole command (start-up, data, opening, compilation,
training steps, evaluations, samples and pictures, checkpoints, full validation), for the closing line and
summary.json."""
from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Iterator

PHASES = ("start-up", "data", "opening", "compilation", "training steps", "evaluations", "samples and pictures",
          "checkpoints", "full validation")


def seconds_since_process_start() -> float | None:
    """How long this process has run (the interpreter's start and the imports included), where the system says
    (Linux's /proc); None elsewhere."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, in ticks since boot
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process so far, by dynamo's own account (tracing, and building the
    forward and backward graphs' kernels, cache lookups included); 0 if dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return float(utils.calculate_time_spent().get("total_wall_time", 0.0)) if utils is not None else 0.0
    except Exception:  # a private account: if a torch release changes it, the breakdown only loses this phase
        return 0.0


class Phases:
    """Seconds per phase of this process's run, from `started` (perf_counter) on; start-up is what came before."""

    def __init__(self, start_up: float | None = None):
        self.started = time.perf_counter()
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.seconds["start-up"] = start_up or 0.0
        self.first_step: float | None = None  # the session's first training step, compilation not included

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Time a phase; what torch.compile spends inside it counts as compilation instead."""
        start, compiled = time.perf_counter(), compile_seconds()
        try:
            yield
        finally:
            compiling = compile_seconds() - compiled
            self.seconds["compilation"] += compiling
            self.seconds[phase] += time.perf_counter() - start - compiling

    def report(self) -> dict[str, float]:
        """Every phase, "other" (what no phase claims: messages, TensorBoard, the summary) and "total"."""
        total = self.seconds["start-up"] + time.perf_counter() - self.started
        return {**self.seconds, "other": max(0.0, total - sum(self.seconds.values())), "total": total}

    def line(self, report: dict[str, float]) -> str:
        parts = [f"{seconds:.1f} s {phase}" + (f" (the first {self.first_step:.1f} s)" if phase == "training steps"
                                                and self.first_step is not None else "")
                 for phase, seconds in report.items() if phase != "total" and (seconds >= 0.05 or phase == "training steps")]
        since = "since the command started" if self.seconds["start-up"] else "in this call"
        return f"where the time went: {', '.join(parts)}; {report['total']:.1f} s {since}"
