"""The gate: every file read from disk that someone else may have made (a checkpoint, the record of a run folder's
keep-aside, a token cache entry, a corpus, a text a checkpoint names) is checked here before anything is allocated for
it, read from it or moved on its word; a file that fails is one line naming it (and the field) and the fix.

What a kind of file must hold is described by its owner (training.checkpoint derives a checkpoint's tensors from its
model config; common.run_folder names the files a run writes); reading, and comparing what was read with that
description, happen here, the same way for every reader. The rules:
- a file is read only if it is a regular file (never a device, pipe or socket, which may block or never end), and
  never beyond the size the system reported when it was opened; a file that changes size while it is read is refused;
- a checkpoint's zip listing is read first: its records stored (not compressed), their number and the pickle's size
  bounded; it is then unpickled with weights_only=True from a memory map, so that no tensor's bytes are read before
  every tensor's kind, shape, dtype and storage size has been compared with what the model config implies; each
  tensor copied out is then compared with the CRC-32 the zip records for its bytes (a disk error, a file written over
  in place);
- a record (set_aside.json) acts only where it proves that it was written for this very folder (the folder's and the
  keep-aside's own identities, which a copy or a planted folder cannot carry);
- a text a checkpoint names is opened only when it is a regular file of the size recorded, and only to check its
  checksum."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np
import torch

from data.tokenizer import CharTokenizer
from errors import UserError, python_command

BLOCK_BYTES = 1 << 20  # read 1 MiB at a time


# ---- any file: regular, and never read beyond the size it had when opened --------------------------------------------
def open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """path opened for reading, with its size, only if it is a regular file: it is looked at before it is opened (a
    device's open may act), and opened without waiting (a pipe would wait for a writer) and looked at again (it may
    have been swapped in between). The size is the most that read_blocks() reads; a file of /proc or /sys, which
    reports a size of 0 whatever it shows, is refused, never read as empty nor for minutes."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise not_a_file(path, what, mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (info.st_size == 0 and Path(path).resolve().parts[1:2] in (("proc",),
                                                                                                  ("sys",))):
        os.close(fd)
        if stat.S_ISREG(info.st_mode):
            raise UserError(f"{what} {path} is a file of /proc or /sys, which reports a size of 0 whatever it shows; "
                            f"copy it into a file and give that")
        raise not_a_file(path, what, info.st_mode)
    return os.fdopen(fd, "rb"), info.st_size


def not_a_file(path: Path, what: str, mode: int) -> UserError:
    if stat.S_ISDIR(mode):
        return UserError(f"{what} {path} is a folder, not a file; give a file")
    return UserError(f"{what} {path}: not a regular file (a device, pipe or socket); save it to a file and give that")


def changed(path: Path, size: int, got: int, what: str) -> UserError:
    return UserError(f"{what} {path} changed while it was read ({size:,} bytes when opened, {got:,} then); nothing was "
                     f"made of it; run the command again once nothing is writing to it")


def read_blocks(f: BinaryIO, size: int, path: Path, what: str, block: int = BLOCK_BYTES,
                file_size: int | None = None) -> Iterator[bytes]:
    """Exactly size bytes of f (the start of a file of file_size bytes when opened; by default all of it), block by
    block; a file that turns out shorter or longer (written to meanwhile) is refused."""
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
    """The whole of a small regular file, refused beyond max_bytes (the line ending in fix)."""
    f, size = open_regular(path, what)
    with f:
        if size > max_bytes:
            raise UserError(f"{what} {path} is {size:,} bytes, more than the {max_bytes:,} such a file can hold; {fix}")
        return b"".join(read_blocks(f, size, path, what))


def utf8_text(data: bytes, named: str) -> str:
    """data decoded as UTF-8, or one line naming the first byte that is not (named: how the user gave the file)."""
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


# ---- a corpus: the checksum covers the bytes tokenized ---------------------------------------------------------------
def file_mark(i: int) -> bytes:
    """What a corpus's checksum takes before the bytes of its i-th file (so that moving bytes between files changes it)."""
    return f"\0file{i}\0".encode()


def corpus_blocks(files: list[Path], digest=None) -> Iterator[tuple[int, Path, bytes]]:
    """(index, path, block) over the files of a corpus, each read to the size it had when opened; digest, when given,
    takes every byte with the files' marks: after the last block it is the corpus's checksum."""
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


def same_text(corpus_name: str, sha256: str, digest, when: str) -> None:
    """The corpus read again gave the checksum it had: else it changed while it was prepared, and nothing is kept."""
    if digest.hexdigest() != sha256:
        raise text_changed(corpus_name, when)


def recorded_size(path: Path, record: dict) -> str | None:
    """Why path cannot be the one-file text a checkpoint's record (its "data") describes, judged from its metadata
    alone, nothing opened: not a regular file, no checksum to compare, or not of the size recorded ("bytes"; an older
    record without it: at least its "n_chars" bytes, since every character takes one or more; a file of /proc reports
    0). None where it may be."""
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
    """The bytes of the one-file text a checkpoint names, read once (at most max_bytes), where it is a regular file
    of the size recorded (recorded_size) whose checksum is the one recorded; else None."""
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


# ---- a token cache entry ---------------------------------------------------------------------------------------------
CACHE_FORMAT = 2  # an entry of another format (1: no checksum of its vocabulary) is prepared again
META_MAX_BYTES = 16 << 20  # meta.json: every character of Unicode fits in a few MB


def vocab_sha256(vocab: str) -> str:
    """The checksum of a vocabulary that a cache entry's meta.json records beside it."""
    return hashlib.sha256(vocab.encode("utf-8", "surrogatepass")).hexdigest()


def cache_entry(entry: Path) -> tuple[dict, None] | tuple[None, str]:
    """A token cache entry's metadata as checked, or why the entry cannot be used, in the words that follow its path in
    a note ("are damaged (val.bin is missing)"). Checked each time an entry is opened (a few seconds for a billion
    tokens): its format; its metadata typed and consistent with its vocabulary, whose characters beyond the base
    vocabulary (base_vocab_size) are in code-point order, each once, as prepared, and whose checksum is the one recorded
    (a character replaced may keep that order); each token file a regular file of the size its count gives; every id
    below the vocabulary size."""
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


def entry_damage(entry: Path, meta: dict) -> str | None:
    """What is wrong with a cache entry whose meta.json holds meta, in a few words; None where nothing is."""
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


# ---- a record in a run folder ----------------------------------------------------------------------------------------
RECORD_MAX_BYTES = 1 << 16


def identity(path: Path) -> list[int]:
    """A folder's identity on this machine (device and inode): a copy, or a folder made elsewhere, has another."""
    info = os.lstat(path)
    return [info.st_dev, info.st_ino]


def proven_record(record: Path, folder: Path, own_name: Callable[[str], bool]) -> tuple[dict[str, int] | None, str]:
    """(the names and sizes a keep-aside's record lists, "") where the record proves it was written for this very
    folder and its keep-aside: it names the run folder's identity and that of the folder it lies in (which a
    rename keeps, and a copy, an unpacked archive or a planted folder cannot carry), and only a run's own files, each
    with a whole-number size; else (None, why)."""
    try:
        data = json.loads(read_small(record, "the record", RECORD_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None, "it holds no record of what was set aside"
    except (OSError, ValueError, UserError) as err:
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


# ---- a checkpoint: its zip listing first, then its tensors compared before any is read ------------------------------
PICKLE_MAX_BYTES = 4 << 20  # a checkpoint's pickle (everything but the tensors' bytes): 13 KB for the debug preset's,
# about 15 bytes per logged loss. The weights-only unpickler took 140 MB and 5.6-6.6 s (on 2 cores shared with other
# work, load average 7-11) for 4 MB of its costliest opcodes (an empty dict every two bytes).
RECORDS_MAX = 100_000  # the zip's entries: one per tensor saved, ~4 per weight with AdamW; ZipInfo takes ~0.5 KB each
OWN_RECORDS = {"data.pkl", ".format_version", ".storage_alignment", "byteorder", "version", ".data/version",
               ".data/serialization_id"}  # (.data/version: the version record's other name, which torch reads too)
SMALL_RECORD_BYTES = 64


def zip_entry_count(f: BinaryIO, size: int) -> int | None:
    """The number of entries a zip's end record announces (ZIP64's where the classic one is saturated), read before
    zipfile reads the whole central directory into objects; None where there is no end record."""
    tail_size = min(size, 22 + 65535)
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    entries = struct.unpack("<H", tail[at + 10:at + 12])[0]
    locator = tail.rfind(b"PK\x06\x07", 0, at)
    if entries == 0xFFFF and locator >= 0 and at - locator == 20:
        record_at = struct.unpack("<Q", tail[locator + 8:locator + 16])[0]
        if record_at + 56 > size:
            return None
        f.seek(record_at)
        record = f.read(56)
        if record[:4] != b"PK\x06\x06":
            return None
        entries = struct.unpack("<Q", record[32:40])[0]
    return entries


def checkpoint_listing(path: Path) -> dict[str, zipfile.ZipInfo]:
    """name -> the zip's entry (its size, its CRC-32) of every record of a checkpoint, read from its directory: each
    stored, not compressed (so what torch.load maps is what the file holds: a few MB cannot inflate into GBs), under
    one folder, of the names torch.save writes, the pickle at most PICKLE_MAX_BYTES and the others tiny."""
    def refused(why: str) -> UserError:
        return UserError(f"{path} is not a readable checkpoint ({why}); take another checkpoint or train again")
    try:
        f, size = open_regular(path, "the checkpoint")
    except FileNotFoundError:
        raise UserError(f"no checkpoint at {path}; train one first ({python_command('train.py')}) or pass --ckpt "
                        f"FILE") from None
    with f:
        if size == 0:
            raise refused("it is empty")
        count = zip_entry_count(f, size)
        if count is None:
            raise refused("it is not a zip file, as torch.save writes; it may be truncated")
        if count > RECORDS_MAX:
            raise refused(f"its zip lists {count:,} records, more than the {RECORDS_MAX:,} a model's tensors make")
        f.seek(0)
        try:
            entries = zipfile.ZipFile(f).infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
            raise refused(f"its zip cannot be read: {type(err).__name__}") from None
    folders = {info.filename.split("/", 1)[0] for info in entries}
    if len(folders) != 1 or len(entries) > RECORDS_MAX:
        raise refused("its zip is not laid out as torch.save lays it out")
    listing: dict[str, zipfile.ZipInfo] = {}
    for info in entries:
        name = info.filename.split("/", 1)[1] if "/" in info.filename else ""
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise refused(f"its record {name[:40]} is compressed, which torch.save never does")
        if name in listing or not (name in OWN_RECORDS or (name.startswith("data/") and name[5:].isdigit())):
            raise refused(f"its zip holds a record torch.save does not write: {name[:40]!r}")
        listing[name] = info
    if "data.pkl" not in listing:
        raise refused("its zip holds no data.pkl")
    if listing["data.pkl"].file_size > PICKLE_MAX_BYTES:
        raise refused(f"its pickle is {listing['data.pkl'].file_size:,} bytes, more than the {PICKLE_MAX_BYTES:,} a "
                      f"checkpoint's settings and records need")
    if any(info.file_size > SMALL_RECORD_BYTES for name, info in listing.items()
           if name in OWN_RECORDS - {"data.pkl"}):
        raise refused("a record of its zip's own is larger than torch.save writes")
    return listing


def read_checkpoint(path: Path):
    """A checkpoint's contents, after its listing is checked (checkpoint_listing): unpickled with weights_only=True
    (tensors and plain data only, never code) from a memory map of the file, so its tensors' bytes stay on disk until
    they are copied (materialized), after they are checked. Returns (contents, listing)."""
    listing = checkpoint_listing(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err) and "GLOBAL" in str(err):  # it names code to run
            raise UserError(f"{path} was refused: it asks to run code or build objects beyond tensors and plain "
                            f"data, which a checkpoint of this trainer never does") from None
        raise UserError(f"{path} is not a readable checkpoint (UnpicklingError); it may be truncated or "
                        f"not a checkpoint at all") from None
    except Exception as err:  # a truncated zip, a pickle that does not fit its records, ...
        raise UserError(f"{path} is not a readable checkpoint ({type(err).__name__}); it may be truncated or "
                        f"not a checkpoint at all") from None
    return state, listing


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor of a checkpoint must be: its shape and the dtypes it may have."""
    shape: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]


def shape_text(shape: tuple | None) -> str:
    return "no such tensor" if shape is None else "(" + ", ".join(map(str, shape)) + ")"


def tensor_kind(t) -> str | None:
    """Why t is not an ordinary tensor whose bytes are its own (None where it is): a meta, sparse or nested tensor, a
    view of a larger storage (whose bytes beyond the view would be read or kept for nothing), or not a tensor."""
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}, not a tensor"
    if t.is_meta:
        return "a meta tensor (shape without values)"
    if t.is_nested:
        return "a nested tensor"
    if t.layout != torch.strided:
        return f"a {t.layout} tensor"
    if not t.is_contiguous() or t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return "a view of a larger storage"
    return None


def check_tensors(found: dict, expected: dict[str, TensorSpec], where: Path, *, label: str, fits: str, holds: str,
                  prefix: str = "") -> None:
    """found (name -> tensor, as read) holds exactly the tensors expected, each an ordinary tensor of its shape and one
    of its dtypes, compared before any tensor's bytes are read; else one line naming the first that differs (as
    prefix + name): "{where}: {fits} (name: the config gives ..., the file holds ...)", or for a tensor of the wrong
    kind "{where} is damaged: {label} name is ..., where {holds}"."""
    for name in sorted(found.keys() | expected.keys(), key=str):
        t, spec = found.get(name), expected.get(name)
        shown = f"{prefix}{name}"[:100]
        if spec is None or name not in found or not isinstance(t, torch.Tensor):
            held = shape_text(tuple(t.shape)) if isinstance(t, torch.Tensor) else (
                "no such tensor" if name not in found else f"a {type(t).__name__}")
            raise UserError(f"{where}: {fits} ({shown}: the config gives {shape_text(spec and spec.shape)}, the file "
                            f"holds {held})")
        kind = tensor_kind(t) or (None if t.dtype in spec.dtypes else f"a {t.dtype} tensor")
        if kind:
            raise UserError(f"{where} is damaged: {label} {shown} is {kind}, where {holds}")
        if tuple(t.shape) != spec.shape:
            raise UserError(f"{where}: {fits} ({shown}: the config gives {shape_text(spec.shape)}, the file holds "
                            f"{shape_text(tuple(t.shape))})")


def tensors_in(value, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(where, tensor) for every tensor anywhere in a checkpoint's contents."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensors_in(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from tensors_in(item, f"{prefix}/{i}")


def check_records(state, listing: dict[str, zipfile.ZipInfo], where: Path) -> None:
    """Every tensor in the contents owns its storage (no view of a larger one), and the zip holds no tensor record
    beyond the storages the contents use: once every tensor has been compared with what the config implies (by its
    shape), the bytes the file maps are bounded by it too."""
    used: dict[int, int] = {}
    for name, t in tensors_in(state):
        kind = tensor_kind(t)
        if kind:
            raise UserError(f"{where} is damaged: {name.lstrip('/')[:80]} is {kind}; take another checkpoint or "
                            f"train again")
        used[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    stored = sum(info.file_size for name, info in listing.items() if name.startswith("data/"))
    if stored != sum(used.values()):
        raise UserError(f"{where} is damaged: its zip holds {stored:,} bytes of tensors, its contents use "
                        f"{sum(used.values()):,}; take another checkpoint or train again")


def materialized(value, device: torch.device | str = "cpu", check: Callable[[str, torch.Tensor], None] | None = None,
                 name: str = ""):
    """The contents with every tensor copied into memory (on device) from the memory map, once checked; check(where,
    copy) sees each copy in memory before it goes to the device (stored_intact)."""
    if isinstance(value, torch.Tensor):
        copy = value.clone()
        if check is not None:
            check(name, copy)
        return copy if torch.device(device).type == "cpu" else copy.to(device)
    if isinstance(value, dict):
        return type(value)((key, materialized(item, device, check, f"{name}/{key}")) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        items = [materialized(item, device, check, f"{name}/{i}") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return value


def stored_intact(listing: dict[str, zipfile.ZipInfo], where: Path) -> Callable[[str, torch.Tensor], None]:
    """materialized()'s check that a tensor's bytes are those the zip recorded: their size and CRC-32 are those of one
    of its tensor records (any of them, not necessarily its own: each tensor owns its whole storage, check_records),
    else one line naming the tensor. A disk error or a file written over in place is caught so; a checksum is no
    defence against a forger, who can write it too (the rest of the gate is)."""
    recorded = {(info.file_size, info.CRC) for name, info in listing.items() if name.startswith("data/")}

    def check(name: str, t: torch.Tensor) -> None:
        if (t.nbytes, zlib.crc32(t.reshape(-1).view(torch.uint8).numpy())) not in recorded:
            raise UserError(f"{where} is damaged: the bytes of {name.lstrip('/')[:80]} are not those its zip recorded "
                            f"(their CRC-32 differs: a disk error, or the file written over in place); take another "
                            f"checkpoint or train again")
    return check


# ---- a checkpoint's other fields: each of its type ------------------------------------------------------------------
def of_type(value, kind) -> bool:
    """isinstance, except that a bool is not taken for a number."""
    return isinstance(value, kind) and (not isinstance(value, bool) or kind is bool)


def is_number(value) -> bool:
    return of_type(value, (int, float))


def check_fields(state, fields: dict, where: Path) -> None:
    """Every field present and of its type (bool is not taken for a number), or a one-line error naming them."""
    if not isinstance(state, dict):
        raise UserError(f"{where} is not a checkpoint of this trainer (it holds a {type(state).__name__})")
    missing = [k for k in fields if k not in state]
    if missing:
        raise UserError(f"{where} is not a complete checkpoint (missing {', '.join(missing)})")
    wrong = [k for k in fields if not of_type(state[k], fields[k])]
    if wrong:
        raise UserError(f"{where} is damaged: {', '.join(f'{k} is a {type(state[k]).__name__}' for k in wrong)}")


def damaged(where: Path, field: str, value, rule: str) -> UserError:
    """The one line for a field whose value breaks its rule."""
    shown = repr(value) if isinstance(value, (bool, int, float, str, type(None))) else f"a {type(value).__name__}"
    return UserError(f"{where} is damaged: {field} is {shown[:80]}, where it must be {rule}; take another checkpoint "
                     f"or train again")


def check_values(values: dict, rules: dict[str, tuple[Callable[[object], bool], str]], where: Path, prefix: str
                 ) -> None:
    """Each value of values that rules names passes its rule (predicate, what it must be): else one line naming the
    field as prefix.key."""
    for key, (ok, rule) in rules.items():
        if key in values and not ok(values[key]):
            raise damaged(where, f"{prefix}{key}", values[key], rule)


def check_settings(found: dict, expected: dict, free: dict[str, tuple[Callable[[object], bool], str]], where: Path,
                   field: str) -> None:
    """An optimizer group's settings (every key but "params") against the group this project builds: a key it
    builds holds the same value of the same type, except the free ones (hyperparameters a run may change), each
    passing its rule; a key it does not build (a newer torch's) holds a plain value. A key missing is given its
    default by torch."""
    for key, value in found.items():
        if key == "params":
            continue
        if key in free:
            check_values({key: value}, {key: free[key]}, where, f"{field}.")
        elif key in expected:
            want = expected[key]
            same = (type(value) is type(want) and value == want) or (
                isinstance(want, tuple) and isinstance(value, (list, tuple)) and tuple(value) == want
                and all(type(a) is type(b) for a, b in zip(value, want)))
            if not same:
                raise damaged(where, f"{field}.{key}", value, repr(want))
        elif not isinstance(value, (bool, int, float, str, type(None))):
            raise damaged(where, f"{field}.{key}", value, "a plain value")
