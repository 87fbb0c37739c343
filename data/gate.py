"""The gate: files others may have made (a corpus, a text, a keep-aside record) checked before use."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from errors import UserError

BLOCK_BYTES = 1 << 20  # read 1 MiB at a time
CORPUS_BLOCK_BYTES = 1 << 22  # a corpus is decoded 4 MiB at a time: memory bounded whatever its size
RECORD_MAX_BYTES = 1 << 16


def open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """path opened with its size, if a regular file: checked, opened without waiting (a pipe), checked again."""
    info = os.stat(path)
    if stat.S_ISREG(info.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and (info.st_size or Path(path).resolve().parts[1] not in ("proc", "sys")):
            return os.fdopen(fd, "rb"), info.st_size
        os.close(fd)
        if stat.S_ISREG(info.st_mode):
            raise UserError(f"{what} {path} is a /proc or /sys file (its size reads 0); copy it to a file first")
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{what} {path} is a folder, not a file; give a file")
    raise UserError(f"{what} {path}: not a regular file (a device, pipe or socket); save it to a file and give that")


def read_blocks(f: BinaryIO, size: int, path: Path, what: str, block: int = BLOCK_BYTES,
                file_size: int | None = None) -> Iterator[bytes]:
    """Exactly size bytes of f (file_size bytes when opened), block by block; a file written to meanwhile is refused."""
    file_size, got = size if file_size is None else file_size, 0
    while got < size and (data := f.read(min(block, size - got))):
        got += len(data)
        yield data
    if got < size or (got := os.fstat(f.fileno()).st_size) != file_size:
        raise UserError(f"{what} {path} changed while it was read ({file_size:,} bytes when opened, {got:,} then); "
                        f"nothing was made of it; run the command again once nothing is writing to it")


def read_small(path: Path, what: str, max_bytes: int, fix: str = "it is not one this project wrote") -> bytes:
    f, size = open_regular(path, what)
    with f:
        if size > max_bytes:
            raise UserError(f"{what} {path} is {size:,} bytes, more than the {max_bytes:,} such a file can hold; {fix}")
        return b"".join(read_blocks(f, size, path, what))


def utf8_text(data: bytes, named: str) -> str:  # or one line naming the first byte that is not UTF-8
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bom = " (it begins with UTF-16's byte-order mark)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise UserError(f"{named}: not UTF-8 text: byte 0x{data[err.start]:02x} at position {err.start:,} cannot be "
                        f"decoded{bom}; save it as UTF-8") from None


def sha256_of(path: Path, what: str) -> str:
    digest = hashlib.sha256()
    f, size = open_regular(path, what)
    with f:
        for data in read_blocks(f, size, path, what):
            digest.update(data)
    return digest.hexdigest()


def corpus_blocks(files: list[Path], digest=None) -> Iterator[tuple[int, Path, bytes]]:
    """(index, path, block) over a corpus's files, then b"" at each file's end; digest takes a mark and each byte."""
    for i, path in enumerate(files):
        if digest is not None:
            digest.update(f"\0file{i}\0".encode())
        try:
            f, size = open_regular(path, "--data:")
        except OSError as err:
            raise UserError(f"--data: {path} cannot be read ({err.strerror or err}); check it and its "
                            f"permissions") from None
        with f:
            for data in read_blocks(f, size, path, "--data:", CORPUS_BLOCK_BYTES):
                if digest is not None:
                    digest.update(data)
                yield i, path, data
        yield i, path, b""  # the file's end, for a decoder to flush


def recorded_size(path: Path, record: dict, size: int | None = None) -> str | None:
    """Why path cannot be the one-file text a checkpoint's record describes, from its metadata; None where it may be."""
    if size is None:
        try:
            info = os.stat(path)
        except OSError as err:
            return f"it cannot be read ({err.strerror or err})"
        if stat.S_ISDIR(info.st_mode):
            return "it is a folder, whose files a checkpoint does not list"
        if not stat.S_ISREG(info.st_mode):
            return "it is not a regular file (a device, pipe or socket)"
        if not isinstance(record.get("sha256"), str):
            return "the checkpoint holds no checksum of its text to compare"
        size = info.st_size
    n_bytes, n_chars = record.get("bytes"), record.get("n_chars")
    if type(n_bytes) is int:
        if size != n_bytes:
            return f"it is not the text it was trained on ({size:,} bytes, where the record says {n_bytes:,})"
    elif not (type(n_chars) is int and 0 < n_chars <= size):
        return f"it is not the text it was trained on ({size:,} bytes, fewer than the {n_chars} characters recorded)"
    return None


def recorded_text(path: Path, record: dict, max_bytes: int) -> bytes | None:
    """The text a checkpoint names, where a regular file of at most max_bytes, the size and checksum recorded."""
    if recorded_size(path, record) is not None:
        return None
    f, size = open_regular(path, "the checkpoint's text")
    with f:
        if recorded_size(path, record, size) is not None or size > max_bytes:  # (the size of the file opened)
            return None
        data = b"".join(read_blocks(f, size, path, "the checkpoint's text"))
    (digest := hashlib.sha256(b"\0file0\0")).update(data)  # (the mark corpus_blocks gives the first file)
    return data if digest.hexdigest() == record["sha256"] else None


def identity(path: Path) -> list[int]:  # (device, inode): a copy, or a folder made elsewhere, has another
    return [os.lstat(path).st_dev, os.lstat(path).st_ino]


def proven_record(record: Path, folder: Path, own_name: Callable[[str], bool]) -> tuple[dict[str, int] | None, str]:
    """(names and sizes a keep-aside lists, "") where its record names this folder's identities and a run's files."""
    try:
        data = json.loads(read_small(record, "the record", RECORD_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None, "it holds no record of what was set aside"
    except (OSError, ValueError, RecursionError, UserError) as err:  # (RecursionError: JSON nested too deep)
        return None, f"its record cannot be read ({type(err).__name__})"
    if not isinstance(data, dict):
        return None, "its record is malformed"
    moved = data.get("set_aside")
    if not (isinstance(moved, dict) and moved and all(isinstance(name, str) and type(size) is int and size >= 0
                                                      and own_name(name) for name, size in moved.items())):
        return None, "its record does not list files of a run"
    try:
        proven = data.get("folder") == identity(folder) and data.get("aside") == identity(record.parent)
    except OSError:
        proven = False
    if not proven:
        return None, "its record was not written for this folder (a copy, or a record made elsewhere)"
    return moved, ""
