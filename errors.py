"""UserError: a mistake the user can fix. The command-line tools print it as one line and exit with code 2. Beside it,
the other ways a command ends early (Interrupted: stop at once; StepAbandoned: a training step undone by a stop), the
command line's parser and its checks (check_output_file), a project script as a command (python_command), an error
in a few words (disk_error, in_one_line) and the fix for a failed write (space_or_place), and how a command ends
(run_cli)."""
from __future__ import annotations

import argparse
import atexit
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
import threading
from pathlib import Path
from typing import Callable, Iterator, NoReturn


class UserError(Exception):
    """The message names the problem and the fix; no traceback is shown for it."""


class QuietExit(UserError):
    """A UserError another process of the same job reports (under torchrun, rank 0): exit 2 without a word."""


class Interrupted(KeyboardInterrupt):
    """Stop at once (a second Ctrl-C, or one before anything is worth saving); the message says what is left on
    disk. The command exits with 130. A KeyboardInterrupt, so no `except Exception` on the way swallows it."""


class StepAbandoned(Exception):
    """A stop request came between the micro-batches of a training step: the step is undone (no weight changed, the
    batch and dropout streams back where the step began), so the run saves the state before it and resumes exactly."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but every option's help ends with the value it takes when left out, "(default: 0.8)", unless
    it has none or the help already says it; and a line never breaks inside a hyphenated word
    (max-autotune-no-cudagraphs, top-k), so every value a help line names can be copied whole."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default in (None, False, "", argparse.SUPPRESS) or "default" in text
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        """A BooleanFlag as it is given: "--stream [true|false], --no-stream" (the --no- form takes no value)."""
        if isinstance(action, BooleanFlag):
            positive, *negative = action.option_strings
            return ", ".join([f"{positive} [{action.metavar}]", *negative])
        return super()._format_action_invocation(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is a UserError (one line, exit 2) instead of usage text, and help lines keep
    hyphenated words whole."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, formatter_class=kwargs.pop("formatter_class", HelpFormatter), **kwargs)

    def error(self, message: str):
        raise UserError(message)


def parse_bool(text: str) -> bool:
    """true | false in any case, and 1 | 0, yes | no, on | off (nanoGPT's --compile=False too); else ValueError."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


class BooleanFlag(argparse.BooleanOptionalAction):
    """--flag and --no-flag, as argparse's BooleanOptionalAction, and also --flag=VALUE or --flag VALUE with any value
    parse_bool takes: nanoGPT's scripts are driven with --compile=False. Help shows "--flag [true|false], --no-flag"
    (HelpFormatter)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.nargs, self.metavar = "?", "true|false"  # (BooleanOptionalAction takes no value)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            super().__call__(parser, namespace, values, option_string)
            return
        try:
            value = parse_bool(values)
        except ValueError:
            parser.error(f"argument {option_string}: expected true or false, got {values!r}")
        if option_string.startswith("--no-"):
            parser.error(f"argument {option_string}: takes no value; give {option_string} alone, or "
                         f"{self.option_strings[0]}=false")
        setattr(namespace, self.dest, value)


def space_or_place(err: BaseException, option: str) -> str:
    """The fix for a failed write: free disk space when the disk is full (or we cannot tell), else another place."""
    if (isinstance(err, OSError) and err.errno is not None
            and err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)):
        return f"choose another {option}"
    return f"free some disk space or choose another {option}"


def disk_error(err: BaseException) -> str:
    """The reason in a few words: 'No space left on device', 'Permission denied', 'File too large', ..."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    text = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return text[:160]  # torch.save's RuntimeError ('[enforce fail at inline_container.cc] ... file write failed')


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """text as it may reach a terminal: control characters (ESC, BEL, CR, ...) written as visible escapes (\\x1b),
    newlines and tabs kept. Every text read from a file reaches the terminal through it."""
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def in_one_line(err: BaseException) -> str:
    """'Type: the first line of its message', for a warning that lets the work go on. Dynamo's BackendCompilerFailed
    says only "backend='inductor' raised:", so the error it carries is named instead."""
    err = getattr(err, "inner_exception", None) or err
    first_line = (str(err).strip().splitlines() or [""])[0][:160]
    return f"{type(err).__name__}: {first_line}"


PROJECT = Path(__file__).resolve().parent


def python_command(script: str) -> str:
    """'python SCRIPT' (train.py, scripts/sample.py) as the user can type it where they are: the script's path from the
    working folder where it lies inside it, else its full path (a run started as python ~/chargpt/train.py)."""
    path = PROJECT / script
    try:
        shown = str(path.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):  # outside the working folder, or the working folder is gone
        shown = str(path)
    return f"python {shlex.quote(shown)}"


def check_output_file(path: str, option: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file the command writes at its end, checked first so that a long computation never ends in a traceback."""
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
    """The folder a command writes its files into, made with its missing parents (one line where it cannot be). The
    folders made here that are still empty when the command ends (it failed, a full disk, or was stopped before it
    wrote) are removed again, so that a command that wrote nothing leaves the place as it was; not one that another
    process holds (its OS lock: a second export refused while the first is about to write into it)."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{option} {folder} is a file, not a folder; choose another {option}")
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"{option} {folder} is a link to {os.readlink(folder)}, which is not there; choose another "
                        f"{option}")
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # the innermost first
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"{option} {folder}: cannot create the folder ({err.strerror or err}); choose another "
                            f"place") from None
        yield folder
    finally:
        for empty in made:
            with contextlib.suppress(OSError):  # (one that holds a file, or that is not there, stays as it is)
                held = os.open(empty, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (BlockingIOError: another process holds it)
                    empty.rmdir()
                finally:
                    os.close(held)


def _tell(line: str) -> None:
    """The command's last line, on stderr; where stderr's reader has gone too (`... 2>&1 | head`, then a stop), the
    line goes nowhere and the exit code stays the one it names, not Python's 1 for a failed write."""
    try:
        print(shown(line), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        _to_nowhere(sys.stderr)


def _to_nowhere(stream) -> None:
    """Point stream's file descriptor at /dev/null (its reader has gone), so that later writes and Python's flush at
    exit fail nowhere; a stream without a file descriptor is left as it is."""
    with contextlib.suppress(OSError, ValueError):
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, stream.fileno())
        os.close(nowhere)


def _failed_output(err: OSError) -> str | None:
    """Standard output's file (its path where the system says it) when err, a write that names no file, is a full
    disk and that file's disk is the full one; the output then goes to /dev/null, so that Python's own flush at exit
    fails nowhere. None otherwise."""
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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def quiet_while_loading(name: str, line: str = "interrupted") -> Callable[[], None]:
    """For a command's own file (name: its __name__), before it loads torch, which takes a second or more: a Ctrl-C,
    SIGTERM or SIGHUP then ends the process at once with `line` and exit code 130, where Python printed the import's
    traceback (or the process ended without a word). Returns what puts the signals back once loaded. Imported as a
    module (tests, torch.hub) it changes nothing, and a signal the caller ignores stays ignored."""
    previous = {}
    if name == "__main__":
        def stopped(signum, frame):
            _tell(line)
            os._exit(130)
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None and signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL):
                previous[sig] = signal.signal(sig, stopped)

    def put_back() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return put_back


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a command-line main(): a UserError becomes 'error: ...' on stderr and exit code 2; Ctrl-C or SIGTERM
    becomes one line and exit code 130 (clean-up in `finally` blocks runs first); an OSError that no check foresaw
    (a full disk, a permission) becomes one line naming the file; output piped into a reader that has gone ends
    quietly with 141."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM is treated as Ctrl-C
    for stream in (sys.stdout, sys.stderr):  # a terminal whose encoding lacks a character (a latin-1 locale, a Chinese
        if callable(getattr(stream, "reconfigure", None)):  # sample; a file name that is not UTF-8) shows its code
            stream.reconfigure(errors="backslashreplace")  # (Python's own stderr does already)
    try:
        code = main(argv) or 0
        sys.stdout.flush()  # (output to a file is buffered: a full disk then fails here, said, not at exit, unsaid)
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
    except BrokenPipeError:  # the reader of our output has gone (piped into head, say): end quietly, as shells
        # expect of a writer whose reader left (status 141, 128 + SIGPIPE), with nothing more sent down the pipe
        _to_nowhere(sys.stdout)
        return 141
    except OSError as err:
        if err.filename is None and (output := _failed_output(err)):
            _tell(f"error: could not write the output to {output} ({err.strerror or err}); free some disk space "
                  f"there, or send the output elsewhere")
            return 2
        where = f" {err.filename}" if err.filename else ""
        _tell(f"error: could not read or write{where} ({err.strerror or err}); check the path, its permissions and "
              f"the free disk space")
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_without_teardown(code: int) -> NoReturn:
    """End the command with code, as sys.exit would, minus Python's tear-down of every loaded module one by one: with
    torch and its compiler loaded that took 0.8-1.0 s after a CPU run of the default preset had finished, while the
    user waited for the prompt. What an exit must do still happens: the exit handlers run (torch's included) and the
    output is flushed; every file the command wrote was closed before. Where a thread that is not a daemon is still
    running, where Python has no handler list to run, or where the command was started by another program that
    expects control back (a profiler, a debugger, IPython's %run, a harness's runpy.run_path: anything below the
    command's own top level but `python -m`'s runpy), this is sys.exit."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    below = sys._getframe(1).f_back
    while below is not None and below.f_globals.get("__name__") == "runpy":
        below = below.f_back
    if run_exit_handlers is None or below is not None or any(not t.daemon for t in threading.enumerate()
                                                             if t is not threading.main_thread()):
        sys.exit(code)

    def finished(signum=None, frame=None) -> NoReturn:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (piped into head) or a closed stream: nothing more to show
                pass
        os._exit(code)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the work is done: a stop now ends it at once, with its own code
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, finished)
    run_exit_handlers()
    finished()
