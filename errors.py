"""How a command ends: UserError (one line, exit 2), Interrupted (130), the command-line parser, and run_cli."""
from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import re
import shlex
import signal
import stat
import sys
import textwrap
from pathlib import Path
from typing import Callable, Iterator


class UserError(Exception):
    """A mistake the user can fix: its message names the problem and the fix."""


class QuietExit(UserError):
    """A UserError rank 0 reports under torchrun: exit 2 without a word."""


class Interrupted(KeyboardInterrupt):
    """Stop at once, saying what is left on disk; exit 130. No `except Exception` swallows it."""


class StepAbandoned(Exception):
    """A stop came between a step's micro-batches: the step is undone, so the run resumes exactly."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, with "(default: X)" after each help, never breaking a hyphenated word."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text, default = action.help or "", action.default
        if not action.option_strings or default in (None, False, "", argparse.SUPPRESS) or "default" in text:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BooleanFlag):
            positive, *negative = action.option_strings
            return ", ".join([f"{positive} [{action.metavar}]", *negative])
        return super()._format_action_invocation(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is a UserError, not usage text."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=HelpFormatter, **kwargs)

    def error(self, message: str):
        raise UserError(message)


BOOLEANS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(("false", "0", "no", "off"), False)


def parse_bool(text: str) -> bool:
    """A BOOLEANS word in any case; else ValueError."""
    if (value := BOOLEANS.get(text.strip().lower())) is None:
        raise ValueError(text)
    return value


class BooleanFlag(argparse.BooleanOptionalAction):
    """--flag, --no-flag and --flag=VALUE (nanoGPT's --compile=False)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.nargs, self.metavar = "?", "true|false"

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            return super().__call__(parser, namespace, values, option_string)
        try:
            value = parse_bool(values)
        except ValueError:
            parser.error(f"argument {option_string}: expected true or false, got {values!r}")
        if option_string.startswith("--no-"):
            parser.error(f"argument {option_string}: takes no value; give {option_string} alone, or "
                         f"{self.option_strings[0]}=false")
        setattr(namespace, self.dest, value)


def check_type(name: str, value: object, kind: type, words: str) -> None:
    """A TypeError naming the option unless value is of kind (a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} {value!r}: must be {words}, not {type(value).__name__}")


def space_or_place(err: BaseException, option: str) -> str:
    """The fix for a failed write: free disk space if the disk may be full, else another place."""
    full = getattr(err, "errno", None) in (None, errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return f"{'free some disk space or ' if full else ''}choose another {option}"


def disk_error(err: BaseException) -> str:
    """The reason in a few words, e.g. 'Permission denied'."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return (str(err).strip().splitlines() or [type(err).__name__])[-1][:160]


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """text safe for a terminal: control characters but newline and tab become escapes (\\x1b)."""
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def in_one_line(err: BaseException) -> str:
    """'Type: first line of the message', of the error a compiler failure carries."""
    err = getattr(err, "inner_exception", None) or err
    first_line = (str(err).strip().splitlines() or [""])[0][:160]
    return f"{type(err).__name__}: {first_line}"


PROJECT = Path(__file__).resolve().parent


def python_command(script: str) -> str:
    """'python SCRIPT', the path relative to the working folder where it can be."""
    path = PROJECT / script
    with contextlib.suppress(ValueError, OSError):
        path = path.relative_to(Path.cwd().resolve())
    return f"python {shlex.quote(str(path))}"


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file the command writes at its end, checked before the work."""
    target = Path(path)
    if suffixes and target.suffix.lower() not in suffixes:
        raise UserError(f"{option} {path}: the file name must end in one of {', '.join(suffixes)}")
    if target.is_dir():
        raise UserError(f"{option} {path} is a folder; give a file name")
    folder = target.parent
    if (there := next((up for up in (folder, *folder.parents) if up.exists()), None)) and not there.is_dir():
        raise UserError(f"{option} {path}: {there} is a file, not a folder; give a file in a folder")
    if not folder.is_dir():
        raise UserError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UserError(f"{option} {path}: the folder {folder} is not writable; choose another place")
    return target


@contextlib.contextmanager
def output_folder(folder: Path, option: str) -> Iterator[Path]:
    """The folder a command writes into, made with its parents; removed if left empty and unlocked."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{option} {folder} is a file, not a folder; choose another {option}")
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"{option} {folder} is a broken link to {os.readlink(folder)}; choose another {option}")
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"{option} {folder}: cannot create the folder ({err.strerror or err}); choose another "
                            f"place") from None
        yield folder
    finally:
        for empty in made:
            with contextlib.suppress(OSError):
                held = os.open(empty, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    empty.rmdir()
                finally:
                    os.close(held)


def _tell(line: str) -> None:
    """The command's last line, on stderr; nowhere if stderr's reader has gone."""
    try:
        print(shown(line), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _to_nowhere(sys.stderr)


def _to_nowhere(stream) -> None:
    """Point stream at /dev/null, so later writes and the flush at exit cannot fail."""
    with contextlib.suppress(OSError, ValueError):
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, stream.fileno())
        os.close(nowhere)


def _failed_output(err: OSError) -> str | None:
    """stdout's file name (then sent to /dev/null) if err is a full disk and stdout a file on it."""
    if err.errno != errno.ENOSPC:
        return None
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstatvfs(fd).f_bavail:
            return None
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else "standard output"
    except (OSError, ValueError):
        return None
    _to_nowhere(sys.stdout)
    return name


class PutBack(contextlib.ExitStack):
    """Puts the signals back when called, or at the end of its with block."""
    __call__ = contextlib.ExitStack.close


def quiet_while_loading(name: str, line: str = "interrupted") -> PutBack:
    """Around a command's imports: a Ctrl-C, SIGTERM or SIGHUP ends it with `line` and exit 130, no traceback."""
    put_back = PutBack()
    if name == "__main__":
        def stopped(signum, frame):
            _tell(line)
            os._exit(130)
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None and signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
                put_back.callback(signal.signal, sig, signal.signal(sig, stopped))
    return put_back


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run main(): a UserError or an OSError is one line and exit 2; a stop one line and 130."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM is a KeyboardInterrupt
    for stream in (sys.stdout, sys.stderr):
        if callable(getattr(stream, "reconfigure", None)):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = main(argv) or 0
        sys.stdout.flush()  # a full disk fails here, not at exit
        return code
    except QuietExit:
        return 2
    except UserError as err:
        _tell(f"error: {err}")
        return 2
    except Interrupted as err:
        _tell(f"\n{err}")
        return 130
    except KeyboardInterrupt:
        _tell("\ninterrupted")
        return 130
    except BrokenPipeError:  # piped into head: end quietly with 128 + SIGPIPE
        _to_nowhere(sys.stdout)
        return 141
    except OSError as err:
        if err.filename is None and (output := _failed_output(err)):
            _tell(f"error: could not write the output to {output} ({err.strerror or err}); free some disk space "
                  f"there, or send the output elsewhere")
            return 2
        if err.filename is None:  # refused output must not fail again at exit
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                _to_nowhere(sys.stdout)
        where = f" {err.filename}" if err.filename else ""
        _tell(f"error: could not read or write{where} ({err.strerror or err}); check the path, its permissions and "
              f"the free disk space")
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
