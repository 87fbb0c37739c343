"""A run folder: its file names, its one owner (an OS lock held for the process's life), its states, the safe
replacement of the run in it (--overwrite's keep-aside), the checkpoint a script reads from it, and the atomic writes
of every file a run or a script writes.

States: empty (a new run starts) -> running (locked by its owner) -> stopped (ckpt_last, resumable) -> finished
(ckpt_last at max_iters and summary.json). A folder with only ckpt_best can be continued from it; one with only
the logs of a run that saved no checkpoint can only be replaced. --overwrite sets the old run aside in .replaced/
(set_aside) and deletes it only once the new run has something better to keep: an evaluation after step 0, or its
end. A stop before that puts the old run back, and after a crash the folder's next owner does (put_back), where the
record written before anything moved proves it; anything else is one line and exit 2, every file kept: a folder's
word alone never moves or deletes a file.

A run folder may come from someone else, so nothing in it is trusted to be what its name says: the lock is opened
without following a link; a link, device or pipe among the entries a run reads or writes is refused before anything
changes; and every file is written whole under a new name (write_atomic)."""
from __future__ import annotations

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

BEST, LAST = "ckpt_best.safetensors", "ckpt_last.safetensors"  # a run's two checkpoints: its model, its latest state
OLD_CHECKPOINTS = ("ckpt_last.pt", "ckpt_best.pt")  # the format before: scripts/convert_checkpoint.py converts them
LOSS_PICTURE = "loss.png"  # the run's losses, every point, drawn at its end
SUMMARY = "summary.json"  # a finished run's figures
ASIDE = ".replaced"  # where --overwrite keeps the old run until the new one has something better

LOCK = ".lock"
DISCARDED = ".replaced.discarded"  # .replaced renamed before it is deleted: a deletion cut short is never put back
CHECKPOINTS = (LAST, BEST)
LOGS = (SUMMARY, LOSS_PICTURE, "events.out.tfevents.*")
RECORD = "set_aside.json"  # in .replaced/: what the replacing run moved there, written before it moves anything
# The temporary files write_atomic makes in a run folder (NAME.tmp-XXXXXXXX): the only ones removed as leftovers.
OWN_TEMPORARY = re.compile(r"(ckpt_last\.safetensors|ckpt_best\.safetensors|summary\.json|loss\.png)\.tmp-[a-z0-9_]{8}")


def old_format(path: Path) -> UserError:
    """The refusal of a checkpoint of the format before (a zip that only torch.load reads), naming its converter."""
    return UserError(f"{path} is a checkpoint of the old format, which this version does not read; convert it once: "
                     f"{python_command('scripts/convert_checkpoint.py')} {shlex.quote(str(path))}")


def command_line() -> str:
    """This process's command, as a user could paste it."""
    return " ".join(shlex.quote(part) for part in [Path(sys.executable).name, *sys.argv])


def open_lock(path: Path, create: bool) -> int:
    """The lock file's descriptor. A link, a hard link or anything but a plain file is refused, since the owner's note
    would overwrite a file outside the folder through it; O_NONBLOCK: a pipe there never blocks the open."""
    flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(planted(path, "a link")) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise UserError(planted(path, "a hard link to another file" if stat.S_ISREG(info.st_mode) else
                                "not a plain file"))
    return fd


def planted(path: Path, what: str, run_there: bool = True) -> str:
    """The refusal of an entry a run never makes; the advice to remove it only in a folder that holds a run (/, a home
    folder or a folder of texts holds nothing a user should remove for a run)."""
    look = " (after looking at what it points to)" if "link" in what else ""
    way = f"remove {path}{look}, or choose another --out_dir" if run_there else "choose a new or empty --out_dir"
    return (f"{path} is {what}, which a run never makes there; a run writes only inside its folder, so it refuses "
            f"this one: {way}")


def holder(folder: Path) -> str | None:
    """'process PID (its command)' while a process owns the run folder, else None; for readers, who take no lock."""
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
    """(pid, command, since) as the folder's owner wrote them into its lock file ("?" and "" where missing)."""
    lines = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip().splitlines() + ["", "", ""]
    return lines[0] or "?", lines[1], lines[2]


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock_fd: int | None = None
        self.made: tuple[bool, bool] = (False, False)  # whether claim() made the folder, and its lock file
        self.found: set[str] = set()  # the folder's entries before claim() (its lock aside)

    # ---- ownership ------------------------------------------------------------------------------------------
    def claim(self, say=print, resume: bool = False) -> "RunDir":
        """Own the folder, or refuse at once, touching nothing, naming its owner; then clear up what earlier owners left
        half done."""
        if resume and not self.path.exists():
            self.resume_from()  # says there is nothing to resume, without creating the folder
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"--out_dir {self.path} is a file, not a folder; choose another --out_dir")
        fd = self._lock()
        try:
            self.check_entries()
        except BaseException:
            if self.made[1]:  # a refused folder keeps no lock file of ours
                with contextlib.suppress(OSError):
                    os.unlink(self.path / LOCK)
            os.close(fd)
            raise
        # who holds it, for the message above; the lock itself is what counts, so a full disk is no error here
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{command_line()}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(
                "utf-8", "surrogateescape"), 0)  # a path in the command that is not UTF-8 goes back as its own bytes
        self._lock_fd = fd
        self._recover(say)
        return self

    def _lock(self) -> int:
        """The folder's lock file, made where missing, opened and locked, or one line naming its owner. A lock file that
        its last owner removed as it let go (release) locks nothing, nor does one in a folder it removed: the folder is
        then claimed anew."""
        for _ in range(5):
            try:
                self.made = (not self.path.exists(), not (self.path / LOCK).exists())
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as err:  # (a folder of /proc: "no such file", each time)
                raise UserError(f"--out_dir {self.path} cannot be written ({disk_error(err)}); "
                                f"choose another --out_dir") from None
            try:
                self.found = set(os.listdir(self.path)) - {LOCK}
                fd = open_lock(self.path / LOCK, create=True)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise UserError(f"--out_dir {self.path} cannot be written ({disk_error(err)}); "
                                f"choose another --out_dir") from None
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
        raise UserError(f"{self.path} was let go by other processes each time this one claimed it; run the command "
                        f"again")

    def release(self) -> None:
        """Let the folder go. Where it holds what it held before claim() and the lock claim() made (a run refused or
        stopped before it wrote anything), the lock is removed while still held, and the folder too if claim() made it:
        no empty run folder is left behind, and a folder the user made is left as it was."""
        if self._lock_fd is None:
            return
        folder_made, lock_made = self.made
        if lock_made:
            with contextlib.suppress(OSError):
                if set(os.listdir(self.path)) == self.found | {LOCK}:
                    os.unlink(self.path / LOCK)
                    if folder_made:
                        os.rmdir(self.path)
        os.close(self._lock_fd)  # closing the descriptor releases the lock (so does the process's end)
        self._lock_fd = None

    def check_entries(self) -> None:
        """Refuse a folder whose entries are not what a run makes: a link anywhere in it or in .replaced/ (the run
        would write, move or delete through it), a pipe or device, or a folder where the run keeps a file."""
        run_there = bool(self.checkpoints() or self.logs() or ASIDE in self.found)
        for folder in (self.path, self.path / ASIDE):
            if folder != self.path and not self._real_folder(folder):
                continue
            for entry in os.scandir(folder):
                path = Path(entry.path)
                if entry.is_symlink():
                    raise UserError(planted(path, "a link", run_there))
                if not (entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)):
                    raise UserError(planted(path, "not a plain file or folder", run_there))
                if entry.is_dir(follow_symlinks=False) and (entry.name in CHECKPOINTS + (LOCK, SUMMARY)
                                                            or entry.name.startswith("events.out.tfevents.")):
                    raise UserError(planted(path, "a folder where the run keeps a file"))

    def _real_folder(self, path: Path) -> bool:
        """True where path is a folder itself, False where nothing is there; a link or anything else is refused."""
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(mode):
            raise UserError(planted(path, "a link" if stat.S_ISLNK(mode) else "not a folder"))
        return True

    def _recover(self, say) -> None:
        for stale in self.path.iterdir():  # a write cut short; only the owner may remove these, and only its own
            if OWN_TEMPORARY.fullmatch(stale.name) and stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
        if self._real_folder(self.path / DISCARDED):
            self._delete_recorded(self.path / DISCARDED)
        for making in self.path.glob(f"{ASIDE}.tmp-*"):  # a .replaced/ cut short before it was named: its record
            if making.is_dir() and not making.is_symlink() and {p.name for p in making.iterdir()} <= {RECORD}:
                if (making / RECORD).exists():
                    self._delete_recorded(making)
                with contextlib.suppress(OSError):
                    making.rmdir()
        if self.aside_pending():
            self.put_back()
            say(f"note: restored the run that --overwrite was replacing in {self.path}: the new run ended before "
                f"its first evaluation after step 0, so the old run was still the one to keep")

    # ---- replacing a run ------------------------------------------------------------------------------------
    def set_aside(self) -> bool:
        """Move the old run's files into .replaced/ by renames, after writing there the record of what moves and the
        identities that prove it was written for this folder (data.gate.proven_record). True if there were any."""
        old = self.checkpoints() + self.logs()
        if not old:
            return False
        moved = {path.name: path.stat().st_size for path in old}
        # made under another name, then renamed (keeping its identity): never a .replaced/ without its record
        making = Path(tempfile.mkdtemp(dir=self.path, prefix=f"{ASIDE}.tmp-"))
        record = {"set_aside": moved, "folder": gate.identity(self.path), "aside": gate.identity(making)}
        write_text_atomic(making / RECORD, json.dumps(record, indent=1) + "\n", "the --overwrite record")
        os.chmod(making, 0o755)
        os.rename(making, self.path / ASIDE)
        for path in old:
            os.replace(path, self.path / ASIDE / path.name)
        return True

    def aside_pending(self) -> bool:
        """.replaced/ is there: an --overwrite's old run may wait in it (put_back decides whether it proves so)."""
        return self._real_folder(self.path / ASIDE)

    def recorded_aside(self, folder: Path) -> tuple[dict[str, int] | None, str]:
        """(the names and sizes moved into folder, "") where its record is proven (data.gate.proven_record) and folder
        holds only the files it lists, each there or not yet moved, of its recorded size; else (None, why)."""
        moved, why = gate.proven_record(folder / RECORD, self.path, self._own_name)
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

    @staticmethod
    def _own_name(name: str) -> bool:
        own_log = re.fullmatch(r"events\.out\.tfevents\.[\w.-]+", name) is not None
        return name in CHECKPOINTS + (SUMMARY, LOSS_PICTURE) or own_log

    def put_back(self) -> Path | None:
        """The old run back, and the replacement's checkpoints and logs moved into a folder named with the time
        (returned; None where it had none), only where recorded_aside proves the keep-aside and the replacement is
        untrained (no summary.json, no checkpoint past step 0); else one line, nothing moved."""
        aside = self.path / ASIDE
        moved, why = self.recorded_aside(aside)
        if moved is None:
            raise UserError(f"{aside} is not a run that --overwrite set aside in this folder ({why}), so nothing was "
                            f"moved or deleted; look at what it holds, then move it out of {self.path} (or remove it) "
                            f"and run the command again")
        in_aside = {name for name in moved if (aside / name).is_file()}
        newer = [path for path in self.checkpoints() + self.logs() if path.name not in moved.keys() - in_aside]
        trained = [path.name for path in newer if path.name == SUMMARY or
                   (path.name in CHECKPOINTS and self.step_of(path) != 0)]
        if trained:
            raise UserError(f"{self.path} holds a run past step 0 ({trained[0]}) beside the run an --overwrite set "
                            f"aside in {aside}, so neither is deleted; keep the one you want: remove {aside} to keep "
                            f"the newer run, or move it elsewhere first")
        kept = self._keep_apart(newer, "undone_overwrite") if newer else None
        for name in sorted(in_aside):
            os.replace(aside / name, self.path / name)
        (aside / RECORD).unlink()
        aside.rmdir()
        return kept

    def _keep_apart(self, paths: list[Path], name: str) -> Path:
        """paths moved (renamed) into a new folder of the run folder, named after name and the time."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for attempt in range(100):
            kept = self.path / (f"{name}_{stamp}" + (f"-{attempt}" if attempt else ""))
            try:
                kept.mkdir()
                break
            except FileExistsError:
                continue
            except OSError as err:
                raise UserError(f"could not make {kept} to keep the replacing run's files apart ({disk_error(err)}), "
                                f"so nothing was moved; {space_or_place(err, '--out_dir')}") from None
        for path in paths:
            os.replace(path, kept / path.name)
        return kept

    # A checkpoint's step, or None (not proven an untrained replacement): training.checkpoint sets its reader here.
    step_of: Callable[[Path], int | None] = staticmethod(lambda path: None)

    def replace_old_run(self, say) -> str | None:
        """--overwrite: set the old run aside, said; returns what a stop now does instead of saving (None: no run)."""
        if not self.set_aside():
            return None
        say(f"--overwrite: the run in {self.path} is kept aside until this one's first evaluation after step 0; a "
            f"stop before that puts it back")
        return "putting back the run that --overwrite is replacing (this run has not saved anything to keep)"

    def keep_new_run(self, say, step: int) -> bool:
        """The new run has something to keep: delete the run it replaces, said once. True if there was one."""
        if not self.aside_pending() or self.recorded_aside(self.path / ASIDE)[0] is None:
            return False
        os.replace(self.path / ASIDE, self.path / DISCARDED)
        self._delete_recorded(self.path / DISCARDED)
        say(f"--overwrite: the run this one replaces is deleted now (this run's step {step} is saved in {self.path})")
        return True

    def _delete_recorded(self, folder: Path) -> None:
        """Delete folder (DISCARDED, or a keep-aside cut short before it was named): its files, record and itself, only
        where the record is proven (data.gate.proven_record) and names every file there; else one line, nothing gone."""
        moved, why = gate.proven_record(folder / RECORD, self.path, self._own_name)
        present = {entry.name for entry in os.scandir(folder) if entry.name != RECORD}
        plain = all(entry.is_file(follow_symlinks=False) for entry in os.scandir(folder))
        if moved is None or not present <= moved.keys() or not plain:
            why = why or "it holds files its record does not list"
            raise UserError(f"{folder} is not what this project leaves there ({why}), so nothing was moved or "
                            f"deleted; look at what it holds, then move it out of {self.path} (or remove it) and run "
                            f"the command again")
        for name in present:
            (folder / name).unlink(missing_ok=True)
        (folder / RECORD).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()

    # ---- state ----------------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        return [self.path / name for name in CHECKPOINTS if (self.path / name).is_file()]

    def logs(self) -> list[Path]:
        return [p for pattern in LOGS for p in self.path.glob(pattern)]

    def logs_besides_events(self) -> list[Path]:
        """The logs a new run refuses to start beside (TensorBoard events alone it keeps in a folder of their own)."""
        return [p for p in self.logs() if not p.name.startswith("events.out.tfevents.")]

    def resume_from(self) -> Path:
        """The checkpoint --resume continues: ckpt_last, else ckpt_best; one line saying why not otherwise."""
        if found := self.checkpoints():  # in the order of CHECKPOINTS: ckpt_last first
            return found[0]
        self.refuse_old()
        if self.logs():
            again = ("with --overwrite instead of --resume (it replaces them)" if self.logs_besides_events() else
                     "without --resume (its logs are kept in a folder of their own)")
            raise UserError(f"--resume: {self.path} holds only the logs of a run that stopped before its first "
                            f"checkpoint, so there is nothing to continue; start it again {again}")
        raise UserError(f"--resume: there is no {self.path / LAST} to continue (no run there); drop --resume "
                        f"to start a new run")

    def refuse_old(self) -> None:
        """A folder whose only checkpoints are of the old format: one line naming the converter."""
        if old := [self.path / name for name in OLD_CHECKPOINTS if (self.path / name).is_file()]:
            raise old_format(old[0])

    def check_new_run(self, overwrite: bool, say=print) -> None:
        """A new run needs an empty folder or --overwrite, else one line saying what is there and the ways on. Events
        alone (of a run stopped before its first checkpoint) move to a folder of their own, which TensorBoard shows."""
        if overwrite:
            return
        events = [path for path in self.path.glob("events.out.tfevents.*") if path.is_file()]
        if events and not self.checkpoints() and not self.logs_besides_events():
            kept = self.path / time.strftime("events_before_%Y%m%d-%H%M%S")
            kept.mkdir()
            for path in events:
                os.replace(path, kept / path.name)
            say(f"note: {self.path} held only the events of a run that stopped before its first checkpoint; they "
                f"are kept in {kept}")
            return
        where = shlex.quote(str(self.path))
        if not self.checkpoints():
            self.refuse_old()
        if (self.path / LAST).is_file():
            raise UserError(f"{self.path} already holds a run; pass --resume to continue it "
                            f"({python_command('train.py')} --out_dir {where} --resume), --overwrite to replace it, or "
                            f"choose another --out_dir")
        if self.checkpoints():
            raise UserError(f"{self.path} holds a run with {BEST} but no {LAST}; --resume continues from {BEST}, "
                            f"--overwrite replaces it, or choose another --out_dir")
        if logs := self.logs():
            raise UserError(f"{self.path} holds a run's logs ({', '.join(sorted(p.name for p in logs)[:3])}) but no "
                            f"checkpoint; --overwrite replaces them, or choose another --out_dir")


# ---- files written whole or not at all (temporary name, fsync, rename) -----------------------------------------------
class _Recording:
    """A file that keeps a failed write's OSError, which torch.save hides behind its own, so the message names it."""

    def __init__(self, file: BinaryIO):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str):
        return getattr(self.file, name)


class WriteFailed(UserError):
    """A file could not be written: what failed, what is left as it was, and the fix, as one line; a caller that knows
    more of what is left (an --overwrite's old run put back) says that instead (WriteFailed.line)."""

    def __init__(self, failed: str, kept: str, fix: str):
        self.failed, self.kept, self.fix = failed, kept, fix
        super().__init__(self.line(kept))

    def line(self, kept: str) -> str:
        return f"{self.failed}; {kept}; {self.fix}"


def write_atomic(path: Path, write: Callable[[BinaryIO], None], what: str, option: str = "--out_dir") -> None:
    """Call write(file) on a temporary file beside path, flush it to disk, then rename it over path: a full disk, a
    signal or a crash leaves the previous file as it was (the temporary file is removed; after a crash, by the run
    folder's next owner). The temporary file is new, made with O_EXCL under a name nobody can guess (mkstemp), so a
    link planted in a shared folder cannot send the bytes elsewhere, and the rename replaces a link at path rather
    than writing through it. option: the flag that chose the place (named in the fix)."""
    tmp = None
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.tmp-")
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            recording = _Recording(f)
            try:
                write(recording)
            except RuntimeError as err:  # torch.save: the OSError that write() met, if it met one
                raise (recording.error or err) from None
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private (0600); the file gets the usual permissions
        os.replace(tmp, path)
    except BaseException as err:  # the old file stays, the half-written one goes
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if not isinstance(err, (OSError, RuntimeError)):
            raise  # an interrupt
        kept = f"the previous {what.removeprefix('the ')} is untouched" if path.exists() else "nothing was written"
        raise WriteFailed(f"could not write {what} {path} ({disk_error(err)})", kept,
                          space_or_place(err, option)) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str, what: str, option: str = "--out_dir") -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8", "backslashreplace")), what, option)  # a non-UTF-8 path


# ---- the checkpoint a script reads -----------------------------------------------------------------------------------
def read_summary(folder: Path) -> dict | None:
    """A run's summary.json, read through the gate (a small regular file: a pipe in its place is never waited on), or
    None where it is missing or not a JSON object."""
    try:
        summary = json.loads(gate.read_small(folder / SUMMARY, "the run's summary", gate.RECORD_MAX_BYTES))
    except (OSError, ValueError, UserError):
        return None
    return summary if isinstance(summary, dict) else None


def find(out_dir: str, ckpt: str, names: tuple[str, ...] = (BEST, LAST),
         say: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
         option: str = "--out_dir") -> Path:
    """The checkpoint a script reads: --ckpt FILE (without --out_dir), else the first of names in out_dir (by default
    ckpt_best, the lowest validation loss, then ckpt_last); with neither, the newest run in out/ not still
    training, said, so the command after `python train.py` needs no folder name (which depends on the corpus the run
    could reach).
    option: how the caller's user gives the folder (the scripts' --out_dir, the Python API's run argument), named
    where a message asks for another."""
    if ckpt:
        if out_dir:  # (which of the two was meant is the user's to say)
            raise UserError("give --out_dir (a run's folder) or --ckpt (a checkpoint file), not both")
        return Path(ckpt)
    if not out_dir:
        newest, training = newest_run(Path("out"), names)
        passed_over = "; ".join(f"{folder}, which {owner} is still training" for folder, owner in training[:2])
        if newest is None and training:
            raise UserError(f"the runs in out/ are all still training ({passed_over}); wait for one to finish, or "
                            f"give --out_dir {training[0][0]} to read the model it saved last")
        if newest is None:
            raise UserError("say which model: --out_dir DIR (a training run's folder) or --ckpt FILE; out/ holds no "
                            f"run yet: train one first ({python_command('train.py')})")
        state = "finished" if (newest / SUMMARY).is_file() else "stopped"
        saved = max((newest / name).stat().st_mtime for name in names if (newest / name).is_file())
        say(f"no --out_dir given: {newest}, the newest run in out/ that has {state} (its model saved "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(saved))})"
            + (f"; passed over {passed_over}" if training else ""))
        out_dir = str(newest)
    folder = Path(out_dir)
    if folder.exists() and not folder.is_dir():
        file = folder.is_file()  # (the API takes a file as its run; a script, as --ckpt)
        raise UserError(f"{out_dir} is {'a file' if file else 'a pipe, socket or device'}, not a run folder; give a "
                        f"run folder as {option}" + (f", or a checkpoint file as --ckpt {shlex.quote(out_dir)}"
                                                     if file else ""))
    owner = holder(folder)
    aside = folder / ASIDE
    if aside.is_dir() and not aside.is_symlink() and RunDir(folder).recorded_aside(aside)[0] is not None:
        # an --overwrite's old run waits there (its record says so): the folder's new files are not yet its run
        if owner:
            raise UserError(f"{out_dir} is being replaced by an --overwrite run ({owner}) that has not reached its "
                            f"first evaluation after step 0; until then the run it replaces waits in {folder / ASIDE}: "
                            f"wait for that evaluation, or stop the new run (Ctrl-C, or kill -INT) to put the old "
                            f"one back")
        raise UserError(f"{out_dir}: an --overwrite stopped before its first evaluation after step 0, and the run it "
                        f"was replacing waits in {folder / ASIDE}; {python_command('train.py')} --out_dir "
                        f"{shlex.quote(out_dir)} --resume puts it back and continues it")
    for name in names:
        if (folder / name).exists():
            return folder / name
    RunDir(folder).refuse_old()
    if owner:
        raise UserError(f"{out_dir} holds no {' or '.join(names)} yet: {owner} is training there; wait for its first "
                        f"evaluation, which saves one")
    missing = f"{out_dir}: no such folder" if not folder.exists() else f"{out_dir} holds no {' or '.join(names)}"
    train = f"{python_command('train.py')} --out_dir {shlex.quote(out_dir)}"
    train += " --overwrite" * bool(RunDir(folder).logs_besides_events())  # (as check_new_run refuses)
    others = runs_beside(folder, names)
    if others:  # offline, out/<preset>-shakespeare was trained as out/<preset>-pystdlib: point there, not to training
        shown = ", ".join(str(p) for p in others[:3]) + (", ..." if len(others) > 3 else "")
        raise UserError(f"{missing}; runs with a model beside it: {shown}; give one of them as {option} (or train one "
                        f"there: {train})")
    raise UserError(f"{missing}; train first: {train}")


def newest_run(parent: Path, names: tuple[str, ...]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The folder in parent with the newest model (any of names) that no process holds, or None; and the folders
    with a model that a process holds (still training), newest first, each with its holder()."""
    try:
        found = sorted(((max((p / name).stat().st_mtime for name in names if (p / name).is_file()), p)
                        for p in parent.iterdir() if any((p / name).is_file() for name in names)), reverse=True)
    except OSError:
        return None, []
    owners = [(folder, holder(folder)) for _, folder in found]
    training = [(folder, owner) for folder, owner in owners if owner]
    return next((folder for folder, owner in owners if not owner), None), training


def runs_beside(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """The run folders beside folder (in its parent) that hold a model; those of the same preset first."""
    try:
        found = [p for p in folder.parent.iterdir() if p != folder and any((p / name).is_file() for name in names)]
    except OSError:
        return []
    preset = folder.name.split("-", 1)[0]
    return sorted(found, key=lambda p: (p.name.split("-", 1)[0] != preset, p.name))
