"""What every Colibri command does alike for its user: an argument error is one line (not the usage), Ctrl-C
is one line and exit status 130, and a reader that closes the pipe early (`colibri pack ... | head`) ends the
command quietly."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Callable, NoReturn

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C stopped
PIPE_CLOSED = 141  # 128 + SIGPIPE


class Parser(argparse.ArgumentParser):
    """argparse with the description printed as written and an error in one line that says where the options
    are listed."""

    def __init__(self, description: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)

    def error(self, message: str) -> NoReturn:
        """An argument error: the options are the fix."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")

    def fail(self, message: str) -> int:
        """Any other user error, said in one line on stderr; the exit status to return (2)."""
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        return 2


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def guarded(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "colibri") -> int:
    """`main(argv)`, with Ctrl-C said in one line (every board a command started is stopped as its `with`
    block unwinds) and a closed stdout pipe ending it quietly."""
    # SIGTERM (a CI job's timeout, `kill`) unwinds like Ctrl-C, so the boards a command started are stopped too
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        status = main(argv)
        sys.stdout.flush()  # a pipe closed early fails here, inside the guard, not at the interpreter's exit
        return status
    except KeyboardInterrupt:
        # on a terminal, below the ^C and any half-written line of output
        print(f"{chr(10) if sys.stderr.isatty() else ''}{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point stdout at /dev/null first
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return PIPE_CLOSED


def run_tool(module: str, argv: list[str] | None, prog: str) -> int:
    """`module`'s main(argv), guarded, the import included (a Ctrl-C while numpy loads is one line too)."""
    return guarded(lambda args: importlib.import_module(module).main(args), argv, prog)
