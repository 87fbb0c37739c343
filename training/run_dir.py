"""The run folder's lifecycle: one owner (an OS lock held for the process's life), its state, a safe replacement.

States: empty (a new run starts) -> running (locked by its owner) -> stopped (ckpt_last.pt, resumable) -> finished
(ckpt_last.pt at max_iters and summary.json). A folder with only ckpt_best.pt can be continued from it; one with only
the logs of a run that saved no checkpoint can only be replaced. --overwrite sets the old run aside in .replaced/
until the new run's first checkpoint is written; if the new run dies before that, the next owner puts it back."""
from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from errors import UserError
from training.checkpoint import ASIDE, BEST, LAST
from training.files import disk_error

LOCK = ".lock"
CHECKPOINTS = (LAST, BEST)
LOGS = ("summary.json", "events.out.tfevents.*", "hparams")


def command_line() -> str:
    """This process's command, as a user could paste it."""
    return " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv])


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock_fd: int | None = None

    # ---- ownership ------------------------------------------------------------------------------------------
    def claim(self, say=print, resume: bool = False) -> "RunDir":
        """Become the folder's only owner, or refuse at once, touching nothing, naming the process that owns it.
        The owner then clears what earlier owners left half done."""
        if resume and not self.path.exists():
            self.resume_from()  # says there is nothing to resume, without creating the folder
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--out_dir {self.path} is a file, not a folder; choose another --out_dir")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise UserError(f"--out_dir {self.path} cannot be written ({disk_error(err)}); "
                            f"choose another --out_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip().splitlines()
            os.close(fd)
            pid = holder[0] if holder else "?"
            what = f" ({holder[1]}, since {holder[2]})" if len(holder) >= 3 else ""
            raise UserError(f"{self.path} is in use by process {pid}{what}; wait for it to finish, stop it "
                            f"(kill -INT {pid}), or choose another --out_dir") from None
        try:  # who holds it, for the message above; the lock itself is what counts, so a full disk is no error here
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{command_line()}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(
                "utf-8", "surrogateescape"), 0)  # a path in the command that is not UTF-8 goes back as its own bytes
        except OSError:
            pass
        self._lock_fd = fd
        self._recover(say)
        return self

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock (so does the process's end)
            self._lock_fd = None

    def _recover(self, say) -> None:
        for stale in self.path.glob("*.tmp-*"):  # a write cut short; only the owner may remove these
            stale.unlink(missing_ok=True)
        aside = self.path / ASIDE
        if not aside.is_dir():
            return
        if self.checkpoints():  # the replacement had saved: finish discarding the old run
            shutil.rmtree(aside, ignore_errors=True)
            return
        self._remove(self.logs())  # the replacement's logs, without a checkpoint worth anything
        for old in aside.iterdir():
            os.replace(old, self.path / old.name)
        aside.rmdir()
        say(f"note: restored the run that --overwrite was replacing in {self.path}: the new run stopped before "
            f"it saved a checkpoint")

    # ---- state ----------------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        return [self.path / name for name in CHECKPOINTS if (self.path / name).is_file()]

    def logs(self) -> list[Path]:
        return [p for pattern in LOGS for p in self.path.glob(pattern)]

    def resume_from(self) -> Path:
        """The checkpoint --resume continues: ckpt_last.pt, else ckpt_best.pt; one line saying why not otherwise."""
        for name in CHECKPOINTS:
            if (self.path / name).is_file():
                return self.path / name
        if self.logs():
            raise UserError(f"--resume: {self.path} holds only the logs of a run that stopped before its first "
                            f"checkpoint, so there is nothing to continue; start it again with --overwrite")
        raise UserError(f"--resume: there is no {self.path / LAST} to continue (no run there); drop --resume "
                        f"to start a new run")

    def check_new_run(self, overwrite: bool) -> None:
        """A new run needs an empty folder or --overwrite; the message says what the folder holds and the ways on."""
        if overwrite:
            return
        where = shlex.quote(str(self.path))
        if (self.path / LAST).is_file():
            raise UserError(f"{self.path} already holds a run; pass --resume to continue it (python train.py "
                            f"--out_dir {where} --resume), --overwrite to replace it, or choose another --out_dir")
        if self.checkpoints():
            raise UserError(f"{self.path} holds a run with ckpt_best.pt but no ckpt_last.pt; --resume continues "
                            f"from ckpt_best.pt, --overwrite replaces it, or choose another --out_dir")
        if self.logs():
            raise UserError(f"{self.path} holds the logs of a run that stopped before its first checkpoint; "
                            f"--overwrite replaces them, or choose another --out_dir")

    # ---- replacing a run ------------------------------------------------------------------------------------
    def set_aside(self) -> bool:
        """Move the old run's files into .replaced/ (renames: instant, nothing copied). True if there were any."""
        old = self.checkpoints() + self.logs()
        if not old:
            return False
        aside = self.path / ASIDE
        aside.mkdir()
        for path in old:
            os.replace(path, aside / path.name)
        return True

    def discard_aside(self) -> None:
        """The new run has its first checkpoint: the old run goes for good."""
        shutil.rmtree(self.path / ASIDE, ignore_errors=True)

    @staticmethod
    def _remove(paths: list[Path]) -> None:
        for path in paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
