"""Files a run writes: whole or not at all (temporary name, fsync, rename), and output paths checked before work."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from errors import UserError, space_or_place


def disk_error(err: BaseException) -> str:
    """The reason in a few words: 'No space left on device', 'Permission denied', 'File too large', ..."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return text[:160]  # torch.save's RuntimeError ('[enforce fail at inline_container.cc] ... file write failed')


class _Recording:
    """A file whose failed write keeps its OSError: torch.save reports a full disk as 'unexpected pos 320512 vs
    320404', the error it got from write() lost; the message names the real reason."""

    def __init__(self, file: BinaryIO):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def __getattr__(self, name: str):  # flush, fileno, tell, seek, ...: the file's own
        return getattr(self.file, name)


def write_atomic(path: Path, write: Callable[[BinaryIO], None], what: str, option: str = "--out_dir") -> None:
    """Call write(file) on a temporary file beside path, flush it to disk, then rename it over path.

    A full disk, a signal or a crash leaves the previous file exactly as it was and no temporary file behind. The
    temporary file is new, made with O_EXCL under a name nobody can guess (mkstemp): a link planted in a shared folder
    cannot send the bytes elsewhere, and the rename replaces a link at path rather than writing through it. option:
    the flag that chose the place (named in the fix)."""
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
    except (OSError, RuntimeError) as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        kept = f"the previous {what.removeprefix('the ')} is untouched" if path.exists() else "nothing was written"
        raise UserError(f"could not write {what} {path} ({disk_error(err)}); {kept}; "
                        f"{space_or_place(err, option)}") from None
    except BaseException:  # an interrupt: the old file stays, the half-written one goes
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str, what: str, option: str = "--out_dir") -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8", "backslashreplace")), what, option)  # a non-UTF-8 path


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file the command will write at its end: its folder must exist and it must not be a folder, checked first,
    so a long computation never ends in a traceback."""
    target = Path(path)
    if suffixes and target.suffix.lower() not in suffixes:
        raise UserError(f"{option} {path}: the file name must end in one of {', '.join(suffixes)}")
    if target.is_dir():
        raise UserError(f"{option} {path} is a folder; give a file name")
    folder = target.parent
    if not folder.is_dir():
        raise UserError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{option} {path}: the folder {folder} is not writable; choose another place")
    return target
