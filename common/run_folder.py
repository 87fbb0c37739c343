"""A run folder: its files, its owner (an OS lock), --overwrite's keep-aside, and atomic writes.

--overwrite keeps the old run in .replaced/ until the new one evaluates; a stop before puts it back.
Only a record proven written for this folder moves or deletes a file."""

import contextlib
import errno
import fcntl
import json
import os
import re
import shlex
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Callable

from data import gate
from errors import UserError, disk_error, python_command, space_or_place

BEST, LAST = "ckpt_best.safetensors", "ckpt_last.safetensors"
OLD_CHECKPOINTS = ("ckpt_last.pt", "ckpt_best.pt")
LOSS_PICTURE = "loss.png"
SUMMARY = "summary.json"
ASIDE = ".replaced"  # --overwrite's old run

LOCK = ".lock"
DISCARDED = ".replaced.discarded"  # .replaced, while it is deleted
CHECKPOINTS = (LAST, BEST)
LOGS = (SUMMARY, LOSS_PICTURE, "events.out.tfevents.*")
RECORD = "set_aside.json"  # in .replaced/: what moved there
OWN_TEMPORARY = re.compile(r"(ckpt_last\.safetensors|ckpt_best\.safetensors|summary\.json|loss\.png)\.tmp-[a-z0-9_]{8}")


def old_format(path: Path) -> UserError:
    what = "holds checkpoints of the old format (.pt); convert them" if path.is_dir() else \
        "is a checkpoint of the old format; convert it"
    return UserError(f"{path} {what} once: {python_command('scripts/convert_checkpoint.py')} {shlex.quote(str(path))}")


def resume_command(folder: Path, advice: str = "") -> str:
    command = f"{python_command('train.py')} --out_dir {shlex.quote(str(folder))} --resume"
    return command + (f" {advice}" if advice else "")


def own_name(name: str) -> bool:
    return name in CHECKPOINTS + (SUMMARY, LOSS_PICTURE) or bool(re.fullmatch(r"events\.out\.tfevents\.[\w.-]+", name))


def command_line() -> str:
    return shlex.join([Path(sys.executable).name, *sys.argv])


def open_lock(path: Path, create: bool) -> int:
    """The lock file's descriptor; refuses anything but a plain file."""
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise planted(path, "a link") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise planted(path, "a hard link to another file" if stat.S_ISREG(info.st_mode) else "not a plain file")
    return fd


def planted(path: Path, what: str, run_there: bool = True) -> UserError:
    way = f"remove {path}, or choose another --out_dir" if run_there else "choose a new or empty --out_dir"
    return UserError(f"{path} is {what}, which a run never makes there; {way}")


def holder(folder: Path) -> str | None:
    """'process PID (command)' while a process owns the folder, else None."""
    try:
        fd = open_lock(folder / LOCK, create=False)
    except (OSError, UserError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        pid, command, _ = owner_note(fd)
        return f"process {pid}" + (f" ({command})" if command else "")
    finally:
        os.close(fd)


def owner_note(fd: int) -> tuple[str, str, str]:
    lines = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip().splitlines() + ["", "", ""]
    return lines[0] or "?", lines[1], lines[2]


class RunDir:
    def __init__(self, path: Path, step_of: Callable[[Path], int | None] = lambda path: None):
        self.path = Path(path)
        self.step_of = step_of  # a checkpoint's step; None counts as trained
        self._lock_fd: int | None = None
        self.made: tuple[bool, bool] = (False, False)  # whether claim() made the folder, the lock
        self.found: set[str] = set()  # entries before claim()

    def claim(self, say=print, resume: bool = False) -> "RunDir":
        """Own the folder, or refuse naming its owner; then finish what earlier owners left."""
        if resume and not self.path.exists():
            self.resume_from()
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--out_dir {self.path} is a file, not a folder; choose another --out_dir")
        self._lock_fd = fd = self._lock()
        try:
            self.check_entries()
        except BaseException:
            self.release()
            raise
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{command_line()}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(
                "utf-8", "surrogateescape"), 0)
        self._recover(say)
        return self

    def _lock(self) -> int:
        """Take the folder's lock, or refuse naming its owner."""
        for _ in range(5):
            try:
                self.made = (not self.path.exists(), not (self.path / LOCK).exists())
                self.path.mkdir(parents=True, exist_ok=True)
                try:
                    self.found = set(os.listdir(self.path)) - {LOCK}
                    fd = open_lock(self.path / LOCK, create=True)
                except FileNotFoundError:
                    continue
            except OSError as err:
                raise UserError(f"--out_dir {self.path} cannot be written ({disk_error(err)}); choose another "
                                f"--out_dir") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, command, since = owner_note(fd)
                os.close(fd)
                what = f" ({command}, since {since})" if since else ""
                raise UserError(f"{self.path} is in use by process {pid}{what}; wait for it to finish, stop it "
                                f"(kill -INT {pid}), or choose another --out_dir") from None
            with contextlib.suppress(OSError):
                held, there = os.fstat(fd), os.stat(self.path / LOCK, follow_symlinks=False)
                if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
                    return fd
            os.close(fd)
        raise UserError(f"{self.path} changed owner each time it was claimed; run the command again")

    def release(self) -> None:
        """Let the folder go, removing what claim() made if nothing was written."""
        if self._lock_fd is None:
            return
        folder_made, lock_made = self.made
        if lock_made:
            with contextlib.suppress(OSError):
                if set(os.listdir(self.path)) == self.found | {LOCK}:
                    os.unlink(self.path / LOCK)
                    if folder_made:
                        os.rmdir(self.path)
        os.close(self._lock_fd)
        self._lock_fd = None

    def check_entries(self) -> None:
        """Refuse links, pipes, devices, and folders named as a run's files, here and in .replaced/."""
        run_there = bool(self.checkpoints() or self.logs() or ASIDE in self.found)
        for folder in (self.path, self.path / ASIDE):
            if folder != self.path and not self._real_folder(folder):
                continue
            for entry in os.scandir(folder):
                path = Path(entry.path)
                if entry.is_symlink():
                    raise planted(path, "a link", run_there)
                if not (entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)):
                    raise planted(path, "not a plain file or folder", run_there)
                if entry.is_dir(follow_symlinks=False) and (entry.name in CHECKPOINTS + (LOCK, SUMMARY)
                                                            or entry.name.startswith("events.out.tfevents.")):
                    raise planted(path, "a folder where the run keeps a file")

    def _real_folder(self, path: Path) -> bool:
        """True for a folder, False for nothing; refuses anything else."""
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            raise planted(path, "a link" if stat.S_ISLNK(mode) else "not a folder")
        return True

    def _recover(self, say) -> None:
        for stale in self.path.iterdir():
            if OWN_TEMPORARY.fullmatch(stale.name) and stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
        if self._real_folder(self.path / DISCARDED):
            self._delete_recorded(self.path / DISCARDED)
        for making in self.path.glob(f"{ASIDE}.tmp-*"):  # a .replaced/ cut short
            if making.is_dir() and not making.is_symlink() and {p.name for p in making.iterdir()} <= {RECORD}:
                if (making / RECORD).exists():
                    self._delete_recorded(making)
                with contextlib.suppress(OSError):
                    making.rmdir()
        if self.aside_pending():
            self.put_back()
            say(f"note: restored the old run in {self.path}: the --overwrite run stopped early")

    # ---- replacing a run
    def set_aside(self) -> bool:
        """Move the old run into .replaced/, its record first; True if there was one."""
        old = self.checkpoints() + self.logs()
        if not old:
            return False
        moved = {path.name: path.stat().st_size for path in old}
        # made under another name: never a .replaced/ without its record
        making = Path(tempfile.mkdtemp(dir=self.path, prefix=f"{ASIDE}.tmp-"))
        record = {"set_aside": moved, "folder": gate.identity(self.path), "aside": gate.identity(making)}
        write_text_atomic(making / RECORD, json.dumps(record, indent=1) + "\n", "the --overwrite record")
        os.chmod(making, 0o755)
        os.rename(making, self.path / ASIDE)
        for path in old:
            os.replace(path, self.path / ASIDE / path.name)
        return True

    def aside_pending(self) -> bool:
        return self._real_folder(self.path / ASIDE)

    def recorded_aside(self, folder: Path) -> tuple[dict[str, int] | None, str]:
        """(names and sizes moved, "") if the record is proven and fits the files, else (None, why)."""
        moved, why = gate.proven_record(folder / RECORD, self.path, own_name)
        if moved is None:
            return None, why
        try:
            present = {entry.name for entry in os.scandir(folder)} - {RECORD}
        except OSError:
            return None, "it cannot be listed"
        if not present <= moved.keys():
            return None, "it holds files its record does not list"
        for name, size in moved.items():
            where = folder / name if name in present else self.path / name
            if not where.is_file() or where.is_symlink() or where.stat().st_size != size:
                return None, f"{name} is not the file its record lists"
        return moved, ""

    def put_back(self) -> Path | None:
        """Put the old run back; the replacement's files go to the folder returned."""
        aside = self.path / ASIDE
        moved, why = self.recorded_aside(aside)
        if moved is None:
            raise self._not_ours(aside, why)
        in_aside = {name for name in moved if (aside / name).is_file()}
        newer = [path for path in self.checkpoints() + self.logs() if path.name not in moved.keys() - in_aside]
        trained = [path.name for path in newer if path.name == SUMMARY or
                   (path.name in CHECKPOINTS and self.step_of(path) != 0)]
        if trained:
            raise UserError(f"{self.path} holds a run past step 0 ({trained[0]}) beside the one in {aside}, "
                            f"so neither is deleted; remove {aside} to keep the newer run")
        kept = self._keep_apart(newer, "undone_overwrite") if newer else None
        for name in sorted(in_aside):
            os.replace(aside / name, self.path / name)
        (aside / RECORD).unlink()
        aside.rmdir()
        return kept

    def _keep_apart(self, paths: list[Path], name: str) -> Path:
        """Move paths into a new folder, name_time."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for attempt in range(100):
            kept = self.path / (f"{name}_{stamp}" + (f"-{attempt}" if attempt else ""))
            try:
                kept.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as err:
                raise UserError(f"could not make {kept} ({disk_error(err)}), so nothing was moved; "
                                f"{space_or_place(err, '--out_dir')}") from None
        for path in paths:
            os.replace(path, kept / path.name)
        return kept

    def replace_old_run(self, say) -> str | None:
        """--overwrite: set the old run aside; what a stop now does, or None."""
        if not self.set_aside():
            return None
        say(f"--overwrite: the old run in {self.path} is kept until this run evaluates after step 0")
        return "putting back the run that --overwrite is replacing"

    def keep_new_run(self, say, step: int) -> bool:
        """Delete the replaced run; True if there was one."""
        if not self.aside_pending() or self.recorded_aside(self.path / ASIDE)[0] is None:
            return False
        os.replace(self.path / ASIDE, self.path / DISCARDED)
        self._delete_recorded(self.path / DISCARDED)
        say(f"--overwrite: the replaced run is deleted now; step {step} is saved in {self.path}")
        return True

    def _delete_recorded(self, folder: Path) -> None:
        """Delete folder if its proven record names every file in it."""
        moved, why = gate.proven_record(folder / RECORD, self.path, own_name)
        present = {entry.name for entry in os.scandir(folder) if entry.name != RECORD}
        plain = all(entry.is_file(follow_symlinks=False) for entry in os.scandir(folder))
        if moved is None or not present <= moved.keys() or not plain:
            raise self._not_ours(folder, why or "it holds files its record does not list")
        for name in present:
            (folder / name).unlink(missing_ok=True)
        (folder / RECORD).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()

    def _not_ours(self, folder: Path, why: str) -> UserError:
        return UserError(f"{folder} is not what --overwrite leaves ({why}), so nothing was moved or deleted; "
                         f"move it out of {self.path}, then run the command again")

    def checkpoints(self) -> list[Path]:
        return [self.path / name for name in CHECKPOINTS if (self.path / name).is_file()]

    def logs(self) -> list[Path]:
        return [p for pattern in LOGS for p in self.path.glob(pattern)]

    def logs_besides_events(self) -> list[Path]:
        return [p for p in self.logs() if not p.name.startswith("events.out.tfevents.")]

    def resume_from(self) -> Path:
        """The checkpoint --resume continues."""
        if found := self.checkpoints():
            return found[0]
        self.refuse_old()
        if self.logs():
            again = "with --overwrite instead of --resume" if self.logs_besides_events() else "without --resume"
            raise UserError(f"--resume: {self.path} holds only the logs of a run with no checkpoint; start it "
                            f"again {again}")
        raise UserError(f"--resume: there is no {self.path / LAST} to continue; drop --resume to start a new run")

    def refuse_old(self) -> None:
        if any((self.path / name).is_file() for name in OLD_CHECKPOINTS):
            raise old_format(self.path)

    def check_new_run(self, overwrite: bool, say=print) -> None:
        """A new run needs an empty folder or --overwrite; lone events move aside."""
        if overwrite:
            return
        events = [path for path in self.path.glob(LOGS[2]) if path.is_file()]
        if events and not self.checkpoints() and not self.logs_besides_events():
            kept = self._keep_apart(events, "events_before")
            say(f"note: events of a run with no checkpoint moved to {kept}")
            return
        if not self.checkpoints():
            self.refuse_old()
        if (self.path / LAST).is_file():
            raise UserError(f"{self.path} already holds a run; pass --resume to continue it "
                            f"({resume_command(self.path)}), --overwrite to replace it, or choose another --out_dir")
        if self.checkpoints():
            raise UserError(f"{self.path} holds {BEST} but no {LAST}; pass --resume or --overwrite, or choose "
                            f"another --out_dir")
        if logs := self.logs():
            raise UserError(f"{self.path} holds a run's logs ({', '.join(sorted(p.name for p in logs)[:3])}) but no "
                            f"checkpoint; --overwrite replaces them, or choose another --out_dir")


# ---- files written whole or not at all
class WriteFailed(UserError):
    """A failed write: what failed, what is left, the fix."""

    def __init__(self, failed: str, kept: str, fix: str):
        self.failed, self.kept, self.fix = failed, kept, fix
        super().__init__(self.line(kept))

    def line(self, kept: str) -> str:
        return f"{self.failed}; {kept}; {self.fix}"


def write_atomic(path: Path, write: Callable[[BinaryIO], None], what: str, option: str = "--out_dir") -> None:
    """write(file) to a synced temporary file renamed over path: whole or not at all."""
    tmp = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.tmp-")
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.umask(mask := os.umask(0))
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's is 0600
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if not isinstance(err, (OSError, RuntimeError)):
            raise
        kept = f"the previous {what.removeprefix('the ')} is untouched" if path.exists() else "nothing was written"
        raise WriteFailed(f"could not write {what} {path} ({disk_error(err)})", kept,
                          space_or_place(err, option)) from None


def write_text_atomic(path: Path, text: str, what: str, option: str = "--out_dir") -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8", "backslashreplace")), what, option)


# ---- the checkpoint a script reads
def read_summary(folder: Path) -> dict | None:
    """A run's summary.json as a dict, else None."""
    try:
        summary = json.loads(gate.read_small(folder / SUMMARY, "the run's summary", gate.RECORD_MAX_BYTES))
    except (OSError, ValueError, UserError):
        return None
    return summary if isinstance(summary, dict) else None


def find(out_dir: str, ckpt: str, names: tuple[str, ...] = (BEST, LAST),
         say: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
         option: str = "--out_dir") -> Path:
    """The checkpoint a script reads: --ckpt, else the first of names in out_dir, else the newest run in out/."""
    if ckpt:
        if out_dir:
            raise UserError("give --out_dir or --ckpt, not both")
        return Path(ckpt)
    if not out_dir:
        found = []
        with contextlib.suppress(OSError):
            found = sorted(((when, p) for p in Path("out").iterdir() if (when := saved(p, names)) is not None),
                           reverse=True)
        runs = [(folder, holder(folder)) for _, folder in found]
        training = [(folder, owner) for folder, owner in runs if owner]
        newest = next((folder for folder, owner in runs if not owner), None)
        passed_over = "; ".join(f"{folder}, which {owner} is still training" for folder, owner in training[:2])
        if newest is None and training:
            raise UserError(f"the runs in out/ are all still training ({passed_over}); wait, or give "
                            f"--out_dir {training[0][0]}")
        if newest is None:
            raise UserError(f"say --out_dir DIR or --ckpt FILE; out/ holds no run yet: train one first "
                            f"({python_command('train.py')})")
        state = "finished" if (newest / SUMMARY).is_file() else "stopped"
        say(f"no --out_dir given: {newest}, the newest run in out/ that has {state} (saved "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(saved(newest, names)))})"
            + (f"; passed over {passed_over}" if training else ""))
        out_dir = str(newest)
    folder = Path(out_dir)
    run = RunDir(folder)
    if folder.exists() and not folder.is_dir():
        file = folder.is_file()
        raise UserError(f"{out_dir} is {'a file' if file else 'a pipe, socket or device'}, not a run folder; give a "
                        f"run folder as {option}" + (f", or a checkpoint file as --ckpt {shlex.quote(out_dir)}"
                                                     if file else ""))
    owner = holder(folder)
    aside = folder / ASIDE
    if run.recorded_aside(aside)[0] is not None:
        if owner:
            raise UserError(f"{out_dir} is being replaced by an --overwrite run ({owner}); wait for its first "
                            f"evaluation, or stop it to put the old run back")
        raise UserError(f"{out_dir}: an --overwrite stopped early, and the old run waits in {aside}; "
                        f"{resume_command(folder)} puts it back")
    for name in names:
        if (folder / name).exists():
            return folder / name
    run.refuse_old()
    wanted = " or ".join(names)
    if owner:
        raise UserError(f"{out_dir} holds no {wanted} yet: {owner} is training there; wait a while")
    missing = f"{out_dir}: no such folder" if not folder.exists() else f"{out_dir} holds no {wanted}"
    train = f"{python_command('train.py')} --out_dir {shlex.quote(out_dir)}"
    train += " --overwrite" * bool(run.logs_besides_events())
    others = []
    with contextlib.suppress(OSError):  # runs of its preset first
        preset = folder.name.split("-", 1)[0]
        others = sorted((p for p in folder.parent.iterdir() if p != folder and saved(p, names) is not None),
                        key=lambda p: (p.name.split("-", 1)[0] != preset, p.name))
    if others:
        shown = ", ".join(str(p) for p in others[:3]) + (", ..." if len(others) > 3 else "")
        raise UserError(f"{missing}; runs with a model beside it: {shown}; give one as {option}, or train: {train}")
    raise UserError(f"{missing}; train first: {train}")


def saved(folder: Path, names: tuple[str, ...]) -> float | None:
    """When the newest of names in folder was written, else None."""

    return max(((folder / name).stat().st_mtime for name in names if (folder / name).is_file()), default=None)
