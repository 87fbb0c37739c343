"""UserError: a mistake the user can fix. The command-line tools print it as one line and exit with code 2."""
from __future__ import annotations

import argparse
import sys
from typing import Callable


class UserError(Exception):
    """The message names the problem and the fix; no traceback is shown for it."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line is a UserError (one line, exit 2) instead of usage text."""

    def error(self, message: str):
        raise UserError(message)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run a command-line main(); a UserError becomes 'error: ...' on stderr and exit code 2."""
    try:
        return main(argv) or 0
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
