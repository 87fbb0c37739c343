"""Finding the text: a file, a folder of text files, or a named corpus (shakespeare, pystdlib)."""
from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import tempfile
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tqdm import tqdm

from data.gate import open_regular, sha256_of
from errors import UserError, space_or_place

SHAKESPEARE_URL = os.environ.get(
    "CHARGPT_SHAKESPEARE_URL",
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394
NAMED = ("shakespeare", "pystdlib")
GIVE = f"give a text file, a folder of text files, or one of: {', '.join(NAMED)}"


@dataclass
class Corpus:
    """Files read in order, joined by a newline; name is what the run records."""
    name: str
    files: list[Path]


def default_cache_dir(chosen: str = "") -> Path:
    """--cache_dir, else $XDG_CACHE_HOME/chargpt (if absolute), else ~/.cache/chargpt."""
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "chargpt"


def is_binary(path: Path) -> bool:
    """A NUL byte in the first 8 KB."""
    f, size = open_regular(path, "--data:")
    with f:
        return b"\0" in f.read(min(size, 8192))


def resolve(spec: str, cache_dir: Path, say=print, fallback: bool = False) -> Corpus:
    """A --data value as a Corpus; fallback: pystdlib where Tiny Shakespeare cannot be had."""
    if not spec.strip():
        raise UserError(f"--data is empty; {GIVE}")
    if spec == "shakespeare":
        target = cache_dir / "tinyshakespeare.txt"
        if differs := copy_differs(target):  # the user's own copy: never replaced
            why = f"{target} is not the expected Tiny Shakespeare ({differs})"
            fix = f"move it away or put char-rnn's input.txt there, or train on it as it is: --data {target}"
        else:
            try:
                return Corpus("shakespeare", [download_shakespeare(cache_dir)])
            except OSError as err:
                why = f"could not download Tiny Shakespeare ({err}), and {target} holds no copy"
                fix = "connect to the network, put a copy there, or give --data FILE"
        if not fallback:
            raise UserError(f"--data shakespeare: {why}; {fix}")
        say(f"note: {why}; using the offline corpus 'pystdlib' instead; to change that, {fix}")
        spec = "pystdlib"
    if spec == "pystdlib":
        try:
            return Corpus("pystdlib", [build_pystdlib(cache_dir)])
        except OSError as err:
            raise UserError(f"could not write the pystdlib corpus into {cache_dir} ({err.strerror or err}); "
                            f"{space_or_place(err, '--cache_dir')}") from None
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        try:
            text_files = [p for p in files if not is_binary(p)]
        except OSError as err:
            raise UserError(f"--data: {err.filename} cannot be read ({err.strerror}); check its permissions") from None
        if not text_files:
            raise UserError(f"--data {spec}: the folder holds no text files; {GIVE}")
        if len(text_files) < len(files):
            say(f"note: skipped {len(files) - len(text_files)} binary file(s) in {spec}")
        return Corpus(str(path), text_files)
    if path.is_file():
        return Corpus(str(path), [path])
    if path.exists():  # a device, pipe or socket: it cannot be read twice
        raise UserError(f"--data {spec}: not a regular file or folder (a device, pipe or socket); save the text to a "
                        f"file")
    raise UserError(f"--data {spec}: no such file or folder; {GIVE}")


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """A new file beside target, safe from planted links, that replaces target on success."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.part-")
    os.close(fd)
    os.chmod(name, 0o644)
    try:
        yield Path(name)
        os.replace(name, target)
    finally:
        Path(name).unlink(missing_ok=True)


def copy_differs(target: Path) -> str:
    """How target differs from Tiny Shakespeare; '' where it does not or cannot be read."""
    try:
        f, size = open_regular(target, "the cached")
        f.close()
        if size != SHAKESPEARE_BYTES:
            return f"{size:,} bytes, where the original has {SHAKESPEARE_BYTES:,}"
        if sha256_of(target, "the cached") != SHAKESPEARE_SHA256:
            return f"{size:,} bytes as the original, but another checksum"
    except (OSError, UserError):
        pass
    return ""


def download_shakespeare(cache_dir: Path) -> Path:
    """Tiny Shakespeare, fetched once into the cache and checked against its sha256."""
    target = cache_dir / "tinyshakespeare.txt"
    if target.exists() and sha256_of(target, "the cached") == SHAKESPEARE_SHA256:
        return target
    with replacing(target) as partial:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=5) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc="Tiny Shakespeare", leave=False) as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
        if sha256_of(partial, "the download") != SHAKESPEARE_SHA256:
            raise OSError("the download's checksum does not match")
    return target


PYSTDLIB_CHARS = SHAKESPEARE_BYTES


def build_pystdlib(cache_dir: Path) -> Path:
    """About PYSTDLIB_CHARS characters of this Python's standard library, offline."""
    version = ".".join(map(str, sys.version_info[:3]))
    target = cache_dir / f"pystdlib-{version}-{PYSTDLIB_CHARS}.txt"
    if target.exists():
        return target
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    files = sorted((p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)),
                   key=lambda p: hashlib.sha256(p.relative_to(root).as_posix().encode()).hexdigest())
    written = 0
    with replacing(target) as partial, open(partial, "w", encoding="utf-8", newline="") as out:
        for path in files:
            if written >= PYSTDLIB_CHARS:
                break
            text = ("\n" if written else "") + path.read_text(encoding="utf-8", errors="replace")
            out.write(text)
            written += len(text)
    return target
