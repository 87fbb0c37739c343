"""`python train.py ...` run as a child: Ctrl-C or SIGTERM to the parent is passed on, and the parent waits."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, TextIO

TRAIN = Path(__file__).resolve().parents[1] / "train.py"


def run_train(argv: list[str], output: TextIO | None = None, each_line: Callable[[str], None] | None = None,
              env: dict | None = None, program: list[str] | None = None, cwd: Path | None = None) -> int:
    """`python train.py argv` (or `python *program argv`): its exit code. Its output goes to output, or line by line
    to each_line, or to the terminal."""
    if output is not None:
        streams = {"stdout": output, "stderr": subprocess.STDOUT}
    else:
        streams = {"stdout": subprocess.PIPE if each_line else None}
    child = subprocess.Popen([sys.executable, *(program or [str(TRAIN)]), *argv], text=True, encoding="utf-8",
                             errors="replace", env=env, cwd=cwd, **streams)
    passed_on = {sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum))
                 for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if each_line is not None and output is None:
            for line in child.stdout:
                each_line(line.rstrip("\n"))
        return child.wait()
    finally:
        for sig, handler in passed_on.items():
            signal.signal(sig, handler)
