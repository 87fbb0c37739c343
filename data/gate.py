"""The gate: files someone else may have made (a run folder's keep-aside record, a token cache entry, a corpus, a text
a checkpoint names), checked before anything is read from them or moved on their word; else one line and the fix.
Only regular files are read, never beyond the size they had when opened. (Checkpoints: training.checkpoint.load.)"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from data.tokenizer import CharTokenizer
from errors import UserError

BLOCK_BYTES = 1 << 20  # read 1 MiB at a time


def open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """path opened for reading, with its size, only if it is a regular file: looked at before it is opened (a
    device's open may act), opened without waiting (a pipe would wait) and looked at again. A file of /proc or /sys,
    which reports a size of 0 whatever it shows, is refused."""
    info = os.stat(path)
    if stat.S_ISREG(info.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and (info.st_size or Path(path).resolve().parts[1] not in ("proc", "sys")):
            return os.fdopen(fd, "rb"), info.st_size
        os.close(fd)
        if stat.S_ISREG(info.st_mode):
            raise UserError(f"{what} {path} is a file of /proc or /sys, which reports a size of 0 whatever it shows; "
                            f"copy it into a file and give that")
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{what} {path} is a folder, not a file; give a file")
    raise UserError(f"{what} {path}: not a regular file (a device, pipe or socket); save it to a file and give that")


def changed(path: Path, size: int, got: int, what: str) -> UserError:
    return UserError(f"{what} {path} changed while it was read ({size:,} bytes when opened, {got:,} then); nothing was "
                     f"made of it; run the command again once nothing is writing to it")


def read_blocks(f: BinaryIO, size: int, path: Path, what: str, block: int = BLOCK_BYTES,
                file_size: int | None = None) -> Iterator[bytes]:
    """Exactly size bytes of f (of file_size bytes when opened; by default size), block by block; a file that turns
    out shorter or longer (written to meanwhile) is refused."""
    file_size = size if file_size is None else file_size
    got = 0
    while got < size:
        data = f.read(min(block, size - got))
        if not data:
            raise changed(path, file_size, got, what)
        got += len(data)
        yield data
    now = os.fstat(f.fileno()).st_size
    if now != file_size:
        raise changed(path, file_size, now, what)


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


def file_mark(i: int) -> bytes:  # taken by a corpus's checksum before its i-th file's bytes
    return f"\0file{i}\0".encode()


def corpus_blocks(files: list[Path], digest=None) -> Iterator[tuple[int, Path, bytes]]:
    """(index, path, block) over a corpus's files, each read to the size it had when opened; digest, when given,
    takes every byte and the files' marks (file_mark): the corpus's checksum."""
    for i, path in enumerate(files):
        if digest is not None:
            digest.update(file_mark(i))
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


CORPUS_BLOCK_BYTES = 1 << 22  # a corpus is decoded 4 MiB at a time: memory bounded whatever its size


def text_changed(corpus_name: str, when: str) -> UserError:
    return UserError(f"--data {corpus_name} changed while it was prepared (what was read {when} is not the text first "
                     f"read), so no token files were kept; run the command again once nothing is writing to it")


def same_text(corpus_name: str, sha256: str, digest, when: str) -> None:  # the corpus read again, unchanged
    if digest.hexdigest() != sha256:
        raise text_changed(corpus_name, when)


def recorded_size(path: Path, record: dict) -> str | None:
    """Why path cannot be the one-file text a checkpoint's record ("data") describes, from its metadata alone (not a
    regular file, no checksum, not of the size recorded); None where it may be."""
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
    return size_differs(info.st_size, record)


def size_differs(size: int, record: dict) -> str | None:
    n_bytes, n_chars = record.get("bytes"), record.get("n_chars")
    if type(n_bytes) is int:
        if size != n_bytes:
            return f"it is not the text it was trained on ({size:,} bytes, where the record says {n_bytes:,})"
    elif not (type(n_chars) is int and 0 < n_chars <= size):
        return f"it is not the text it was trained on ({size:,} bytes, fewer than the {n_chars} characters recorded)"
    return None


def recorded_text(path: Path, record: dict, max_bytes: int) -> bytes | None:
    """The bytes of the text a checkpoint names (at most max_bytes), where it is a regular file of the size and
    checksum recorded; else None."""
    if recorded_size(path, record) is not None or os.stat(path).st_size > max_bytes:
        return None
    f, size = open_regular(path, "the checkpoint's text")
    with f:
        if size_differs(size, record) is not None:  # (changed since it was looked at)
            return None
        data = b"".join(read_blocks(f, size, path, "the checkpoint's text"))
    digest = hashlib.sha256(file_mark(0))
    digest.update(data)
    return data if digest.hexdigest() == record["sha256"] else None


CACHE_FORMAT = 2  # an entry of another format (1: no checksum of its vocabulary) is prepared again
META_MAX_BYTES = 16 << 20  # meta.json: every character of Unicode fits in a few MB


def vocab_sha256(vocab: str) -> str:  # recorded beside a cache entry's vocabulary
    return hashlib.sha256(vocab.encode("utf-8", "surrogatepass")).hexdigest()


def cache_entry(entry: Path) -> tuple[dict, None] | tuple[None, str]:
    """A token cache entry's metadata as checked, or why it cannot be used ("are damaged (val.bin is missing)"):
    its format, its metadata consistent with its vocabulary (checksum and order as prepared), each token file of the
    size its count gives, every id below the vocabulary size."""
    path = entry / "meta.json"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None, "are damaged (meta.json is not a file)"
        meta = json.loads(read_small(path, "the cache entry's", META_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None, "are damaged (meta.json is missing)"
    except (OSError, UserError):  # unreadable, over META_MAX_BYTES, or written to while it was read
        return None, "are damaged (meta.json cannot be read)"
    except (ValueError, RecursionError):  # (JSON nested deeper than Python's stack)
        return None, "are damaged (meta.json is not UTF-8 JSON)"
    if not isinstance(meta, dict):
        return None, "are damaged (meta.json is not a JSON object)"
    if type(meta.get("format")) is int and meta["format"] != CACHE_FORMAT:
        return None, f"were written in cache format {meta['format']}, not this version's {CACHE_FORMAT}"
    why = entry_damage(entry, meta)
    return (meta, None) if why is None else (None, f"are damaged ({why})")


def entry_damage(entry: Path, meta: dict) -> str | None:  # what is wrong with a cache entry, in a few words
    try:
        vocab, base = meta["vocab"], meta["base_vocab_size"]
        if meta["format"] != CACHE_FORMAT or not isinstance(vocab, str) or type(base) is not int \
                or not 0 <= base <= len(vocab):
            return "its format, vocab or base_vocab_size is malformed"
        if len(set(vocab)) != len(vocab) or vocab[base:] != "".join(sorted(vocab[base:])):
            return "its vocabulary repeats a character or is out of order"
        if meta["vocab_sha256"] != vocab_sha256(vocab):
            return "its vocabulary does not match its checksum"
        tokenizer = CharTokenizer(vocab)
        if meta["dtype"] != tokenizer.dtype.name or meta["vocab_size"] != tokenizer.vocab_size:
            return "its dtype or vocab_size does not match its vocabulary"
        for split in ("train", "val"):
            n = meta[f"n_{split}"]
            if type(n) is not int or n < 0:
                return f"n_{split} is not a count"
            path = entry / f"{split}.bin"
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or info.st_size != n * tokenizer.dtype.itemsize:
                return f"{split}.bin is not a file of n_{split} tokens"
            if n and int(np.memmap(path, dtype=tokenizer.dtype, mode="r").max()) >= tokenizer.vocab_size:
                return f"{split}.bin holds ids beyond the vocabulary"
        if meta["n_chars"] != meta["n_train"] + meta["n_val"]:
            return "n_chars is not n_train + n_val"
    except KeyError as err:
        return f"meta.json has no {err.args[0]}"
    except FileNotFoundError as err:
        return f"{Path(err.filename).name} is missing"
    except OSError as err:
        return f"{Path(err.filename).name if err.filename else 'a token file'} cannot be read"
    return None


RECORD_MAX_BYTES = 1 << 16


def identity(path: Path) -> list[int]:  # (device, inode): a copy, or a folder made elsewhere, has another
    return [os.lstat(path).st_dev, os.lstat(path).st_ino]


def proven_record(record: Path, folder: Path, own_name: Callable[[str], bool]) -> tuple[dict[str, int] | None, str]:
    """(the names and sizes a keep-aside's record lists, "") where it proves it was written for this very folder:
    it names the identities of the run folder and of its own folder (which a copy or a planted folder cannot carry)
    and only a run's own files; else (None, why)."""
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
