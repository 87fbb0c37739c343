"""A corpus into cached token files (train.bin, val.bin), kept only where each pass read the bytes its key sums."""
from __future__ import annotations

if __name__ == "__main__":  # run as nanoGPT's data/*/prepare.py scripts are
    import sys
    print("error: data/prepare.py is a library; run python scripts/prepare.py --data FILE", file=sys.stderr)
    raise SystemExit(2)

import codecs
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from data.corpus import Corpus
from data.gate import corpus_blocks, read_small
from data.tokenizer import CharTokenizer, codepoints
from errors import UserError, space_or_place


FORMAT = 2  # an entry of another format is prepared again
META_MAX_BYTES = 16 << 20  # meta.json: every character of Unicode fits in a few MB
BOMS = {"UTF-32": (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE), "UTF-16": (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)}


def vocab_sha256(vocab: str) -> str:
    return hashlib.sha256(vocab.encode("utf-8", "surrogatepass")).hexdigest()


def cache_entry(entry: Path) -> tuple[dict, None] | tuple[None, str]:
    """A token cache entry's checked metadata, or why it cannot be used."""
    reading = "meta.json"
    try:
        if not stat.S_ISREG(os.lstat(entry / "meta.json").st_mode):
            return None, "meta.json is not a file"
        meta = json.loads(read_small(entry / "meta.json", "the cache entry's", META_MAX_BYTES).decode("utf-8"))
        if not isinstance(meta, dict):
            return None, "meta.json is not a JSON object"
        if type(meta.get("format")) is int and meta["format"] != FORMAT:
            return None, f"cache format {meta['format']}, not this version's {FORMAT}"
        vocab, base = meta["vocab"], meta["base_vocab_size"]
        if meta["format"] != FORMAT or not isinstance(vocab, str) or type(base) is not int \
                or not 0 <= base <= len(vocab):
            return None, "its format, vocab or base_vocab_size is malformed"
        if len(set(vocab)) != len(vocab) or vocab[base:] != "".join(sorted(vocab[base:])):
            return None, "its vocabulary repeats a character or is out of order"
        if meta["vocab_sha256"] != vocab_sha256(vocab):
            return None, "its vocabulary does not match its checksum"
        tokenizer, reading = CharTokenizer(vocab), "a token file"
        if meta["dtype"] != tokenizer.dtype.name or meta["vocab_size"] != tokenizer.vocab_size:
            return None, "its dtype or vocab_size does not match its vocabulary"
        for split in ("train", "val"):
            n, path = meta[f"n_{split}"], entry / f"{split}.bin"
            if type(n) is not int or n < 0:
                return None, f"n_{split} is not a count"
            if not stat.S_ISREG((info := os.lstat(path)).st_mode) or info.st_size != n * tokenizer.dtype.itemsize:
                return None, f"{split}.bin is not a file of n_{split} tokens"
            if n and int(np.memmap(path, dtype=tokenizer.dtype, mode="r").max()) >= tokenizer.vocab_size:
                return None, f"{split}.bin holds ids beyond the vocabulary"
        if meta["n_chars"] != meta["n_train"] + meta["n_val"]:
            return None, "n_chars is not n_train + n_val"
    except KeyError as err:
        return None, f"meta.json has no {err.args[0]}"
    except FileNotFoundError as err:
        return None, f"{Path(err.filename).name} is missing"
    except (OSError, UserError) as err:  # unreadable, too large, or written to while it was read
        name = Path(err.filename).name if getattr(err, "filename", None) else reading
        return None, f"{name} cannot be read"
    except (ValueError, RecursionError):  # (JSON nested too deep)
        return None, "meta.json is not UTF-8 JSON"
    return meta, None


@dataclass
class Prepared:
    dir: Path
    meta: dict
    tokenizer: CharTokenizer
    reused: bool = False
    seconds: float = 0.0

    def path(self, split: str) -> Path:
        return self.dir / f"{split}.bin"


@dataclass
class Shortfall:
    """The first split shorter than one window of block_size + 1 characters, and each split's size."""
    split: str
    sizes: dict[str, int]
    block_size: int

    def problem(self, of: str = "") -> str:
        n = self.sizes[self.split]
        return (f"the {self.split} split{of} has {n:,} character{'s' * (n != 1)}, fewer than block_size + 1 = "
                f"{self.block_size + 1}")

    @property
    def largest(self) -> int:
        return min(self.sizes.values()) - 1

    @property
    def other_fraction(self) -> str:
        return (f" or a {'larger' if self.split == 'val' else 'smaller'} --val_fraction"
                if sum(self.sizes.values()) >= 2 * (self.block_size + 1) else "")


def short_split(sizes: dict[str, int], block_size: int = 1) -> Shortfall | None:
    split = next((split for split, n in sizes.items() if n < block_size + 1), None)
    return None if split is None else Shortfall(split, sizes, block_size)


class ShortSplit(UserError):
    def __init__(self, line: str, shortfall: Shortfall):
        super().__init__(line)
        self.shortfall = shortfall


def check_splits(name: str, n_train: int, n_val: int, val_fraction: float) -> None:
    if (short := short_split({"train": n_train, "val": n_val})) is not None:
        n_chars = n_train + n_val
        raise ShortSplit(f"--data {name}: too short: --val_fraction {val_fraction:g} splits its {n_chars:,} "
                         f"character{'s' * (n_chars != 1)} into {n_train:,} for training and {n_val:,} for "
                         f"validation, and each needs 2 or more; give a longer text"
                         f"{short.other_fraction}", short)


def read_text(corpus: Corpus, encoding: str, errors: str, digest=None) -> Iterator[str]:
    """The corpus as text chunks, files joined by a newline; digest takes the bytes read."""
    current, decoder, offset = -1, None, 0  # offset: bytes of this file decoded so far
    for i, path, block in corpus_blocks(corpus.files, digest):
        if i != current:
            if i:
                yield "\n"
            current, decoder, offset = i, codecs.getincrementaldecoder(encoding)(errors=errors), 0
        try:
            text = decoder.decode(block, final=not block)
        except UnicodeDecodeError as err:
            bom = next((name for name, marks in BOMS.items() if err.object.startswith(marks)), "")
            if offset == 0 and bom and bom.lower() not in codecs.lookup(encoding).name:
                raise UserError(f"{path} is {bom} text (it has a byte-order mark), not {encoding}; pass "
                                f"--encoding {bom.lower()}") from None
            if b"\0" in err.object and codecs.decode(b"\0", encoding, "ignore") == "\0":
                raise binary(path) from None
            pending = len(err.object) - len(block)  # bytes the decoder held back
            raise UserError(f"{path} is not valid {encoding}: byte {offset - pending + err.start} cannot be decoded; "
                            f"pass --encoding (e.g. latin-1) or --encoding_errors replace") from None
        except UnicodeError as err:
            raise UserError(f"{path} is not valid {encoding} ({err}); pass the file's own --encoding") from None
        if "\0" in text:
            raise binary(path)
        offset += len(block)
        if text:
            yield text


def binary(path: Path) -> UserError:
    return UserError(f"{path} is binary (it contains NUL bytes); --data needs text")


def corpus_key(corpus: Corpus, encoding: str, errors: str, val_fraction: float) -> tuple[str, str, int]:
    """(sha256 of the bytes, the cache folder's name, the number of bytes)."""
    digest, n_bytes = hashlib.sha256(), 0
    for _, _, block in corpus_blocks(corpus.files, digest):
        n_bytes += len(block)
    return digest.hexdigest(), f"{digest.hexdigest()[:20]}-{encoding}-{errors}-val{val_fraction}", n_bytes


def check_encoding(encoding: str, errors: str) -> None:
    try:
        "a".encode(encoding)  # codecs.lookup would take rot13
    except LookupError:
        raise UserError(f"--encoding {encoding}: not a text encoding; try utf-8 or latin-1") from None
    if errors not in ("strict", "replace", "ignore"):
        raise UserError(f"--encoding_errors {errors}: must be strict, replace or ignore")


def remove_stale(folder: Path) -> None:
    """Remove the temporary folders of preparations whose process is gone."""
    for tmp in folder.glob("*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        try:
            if pid.isdigit():
                os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:  # another user's process, alive
            pass


def prepare(corpus: Corpus, cache_dir: Path, val_fraction: float = 0.1,
            encoding: str = "utf-8", errors: str = "strict", say=print, base_vocab: str = "",
            check: Callable[[str, str | None], None] | None = None) -> Prepared:
    """Write (or reuse) a corpus's token files; base_vocab (fine-tuning) starts the vocabulary.
    check(sha256, vocabulary) may refuse the text; it is called first with vocabulary None."""
    check_encoding(encoding, errors)
    check = check or (lambda sha256, vocabulary: None)
    start = time.perf_counter()
    sha256, key, n_bytes = corpus_key(corpus, encoding, errors, val_fraction)
    check(sha256, None)
    if base_vocab:
        key += "-base" + vocab_sha256(base_vocab)[:12]
    final = cache_dir / "prepared" / f"{key}-f{FORMAT}"
    remove_stale(final.parent)
    if final.exists():
        meta, why = cache_entry(final)
        if meta is not None:
            check_splits(corpus.name, meta["n_train"], meta["n_val"], val_fraction)
            check(sha256, meta["vocab"])
            meta.update(source=corpus.name, bytes=n_bytes)
            return Prepared(final, meta, CharTokenizer(meta["vocab"]), reused=True, seconds=time.perf_counter() - start)
        say(f"note: the cached token files in {final} cannot be used ({why}); preparing them again")
        discard(final)
    try:
        return build(corpus, final, key, sha256, n_bytes, val_fraction, encoding, errors, start, base_vocab, check)
    except OSError as err:
        if err.filename and Path(err.filename) in corpus.files:
            raise UserError(f"--data: {err.filename} cannot be read ({err.strerror})") from None
        raise UserError(f"could not write the token cache in {final.parent} ({err.strerror or err}); "
                        f"{space_or_place(err, '--cache_dir')}") from None


def discard(entry: Path) -> None:
    """Rename a damaged entry out of the way, then delete it."""
    trash = entry.with_name(f"{entry.name}.damaged-{os.getpid()}")
    try:
        os.replace(entry, trash)
    except OSError:
        return  # another process took it away first
    shutil.rmtree(trash, ignore_errors=True)


def text_changed(corpus_name: str) -> UserError:
    return UserError(f"--data {corpus_name} changed while it was prepared, so no token files were kept; run the "
                     f"command again once nothing is writing to it")


def build(corpus: Corpus, final: Path, key: str, sha256: str, n_bytes: int, val_fraction: float, encoding: str,
          errors: str, start: float, base_vocab: str, check: Callable[[str, str | None], None]) -> Prepared:
    """Two more passes, each checked against sha256: a changed file leaves no entry."""
    # Pass 1: which characters occur, and how many
    seen = np.zeros(0x110000, dtype=bool)
    n_chars = 0
    digest = hashlib.sha256()
    for text in read_text(corpus, encoding, errors, digest):
        seen[codepoints(text)] = True
        n_chars += len(text)
    if digest.hexdigest() != sha256:
        raise text_changed(corpus.name)
    if n_chars == 0:
        raise UserError(f"--data {corpus.name} is empty; give it some text")
    known = set(base_vocab)
    new = "".join(ch for ch in map(chr, np.flatnonzero(seen)) if ch not in known)
    tokenizer = CharTokenizer(base_vocab + new)
    n_train = int(n_chars * (1 - val_fraction))
    check(sha256, tokenizer.chars)
    check_splits(corpus.name, n_train, n_chars - n_train, val_fraction)

    # Pass 2: the first n_train characters to train.bin, the rest to val.bin
    final.parent.mkdir(parents=True, exist_ok=True)
    # mkdtemp: no planted link redirects the writes; the pid ends its name
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f"{key}.tmp-", suffix=f"-{os.getpid()}"))
    os.chmod(tmp, 0o755)
    try:
        written = 0
        digest = hashlib.sha256()
        with open(tmp / "train.bin", "wb") as train, open(tmp / "val.bin", "wb") as val:
            for text in read_text(corpus, encoding, errors, digest):
                cut = max(0, min(len(text), n_train - written))
                try:
                    # tobytes(), not tofile(): a Ctrl-C inside tofile is a TypeError
                    if cut:
                        train.write(tokenizer.encode_array(text[:cut]).tobytes())
                    if cut < len(text):
                        val.write(tokenizer.encode_array(text[cut:]).tobytes())
                except ValueError:  # the text changed in between
                    raise text_changed(corpus.name) from None
                written += len(text)
        if digest.hexdigest() != sha256 or written != n_chars:
            raise text_changed(corpus.name)
        meta = {
            "format": FORMAT, "source": corpus.name, "files": len(corpus.files), "sha256": sha256, "bytes": n_bytes,
            "encoding": encoding, "encoding_errors": errors, "vocab": tokenizer.chars,
            "vocab_sha256": vocab_sha256(tokenizer.chars), "vocab_size": tokenizer.vocab_size,
            "dtype": tokenizer.dtype.name, "n_chars": n_chars,
            "val_fraction": val_fraction, "n_train": n_train, "n_val": n_chars - n_train,
            "base_vocab_size": len(base_vocab),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8",
                                       errors="backslashreplace")
        os.replace(tmp, final)  # all at once: no half-done entry
    except OSError:
        if not (final / "meta.json").exists():  # else another process made the same entry first
            raise
    finally:  # also on Ctrl-C or SIGTERM
        shutil.rmtree(tmp, ignore_errors=True)
    return Prepared(final, meta, tokenizer, seconds=time.perf_counter() - start)
