"""What every Colibri command does alike for its user: an argument error is one line (not the usage); Ctrl-C,
SIGTERM and SIGHUP (its terminal closed) are one line each and exit status 128 + the signal's number (130, 143,
129), after everything the command holds is given back (boards stopped, farm places released); a reader that
closes the pipe early (`colibri pack ... | head`) ends the command quietly; output that cannot be written (a full
disk, `> /dev/full`) is one line and exit status 2."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
from typing import Callable, NoReturn

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C stopped
PIPE_CLOSED = 141  # 128 + SIGPIPE
CANNOT_WRITE = 2  # the output could not be written: no result was given, as for a user error
# what a write that cannot be done says: a full disk or quota, a file too large, a terminal gone (EIO after SIGHUP)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)",
           **({signal.SIGHUP: "hung up (SIGHUP: its terminal closed)"} if hasattr(signal, "SIGHUP") else {})}
_command: list[str] = []  # the subcommand's name, when a command runs one (colibri farm verify)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds as Ctrl-C does (every `with` gives back what it holds), and ends the command
    with 128 + the signal's number. A KeyboardInterrupt, so what gives things back on Ctrl-C does it here too;
    what goes on after a Ctrl-C (a chat's answer cut short) must not go on after this."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def name_command(prog: str) -> None:
    """The name the one-line interruption uses from here on (`colibri farm verify`, not `colibri farm`)."""
    _command[:] = [prog]


class Parser(argparse.ArgumentParser):
    """argparse with the description printed as written and an error in one line that says where the options
    are listed."""

    def __init__(self, description: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, **kwargs)
        self.command = self.prog  # the command to ask for --help, when prog says more (`colibri run (place X)`)

    def error(self, message: str) -> NoReturn:
        """An argument error: the options are the fix."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.command} --help` lists the options)\n")

    def fail(self, message: str) -> int:
        """Any other user error, said in one line on stderr; the exit status to return (2)."""
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        return 2


def _stop(signum: int, frame: object) -> None:
    # the first one unwinds; one more while it does would cut short the giving back (a place's release)
    for other in SIGNALS:
        if other != signal.SIGINT:
            signal.signal(other, signal.SIG_IGN)
    raise Stopped(signum)


def _say(line: str) -> None:
    """One line on stderr, if stderr is still there (a closed terminal's is not)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _drop_stdout() -> None:
    """stdout pointed at /dev/null: what is left in its buffer is flushed there at exit, not written again where
    it failed (Python would complain after the command's last line)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def guarded(main: Callable[[list[str] | None], int], argv: list[str] | None = None, prog: str = "colibri") -> int:
    """`main(argv)`, with Ctrl-C, SIGTERM and SIGHUP said in one line (every board a command started is stopped
    and every farm place it holds released as its `with` blocks unwind), a closed stdout pipe ending it quietly,
    and output that cannot be written (ENOSPC, EIO) said in one line."""
    # SIGTERM (a CI job's timeout, `kill`) and SIGHUP (the terminal closed) unwind like Ctrl-C; one ignored when the
    # command started (nohup's SIGHUP) stays ignored
    for signum in SIGNALS:
        if signum != signal.SIGINT and signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _stop)
    _command[:] = []
    try:
        status = main(argv)
        sys.stdout.flush()  # a pipe closed early fails here, inside the guard, not at the interpreter's exit
        return status
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        # on a terminal, below the ^C and any half-written line of output
        newline = chr(10) if signum == signal.SIGINT and sys.stderr.isatty() else ""
        _say(f"{newline}{(_command or [prog])[0]}: {SIGNALS[signum]}")
        if signum != signal.SIGINT:
            _drop_stdout()  # a closed terminal's stdout fails at exit too
        return 128 + signum
    except BrokenPipeError:
        # Python would complain again when it flushes stdout at exit: point stdout at /dev/null first
        _drop_stdout()
        return PIPE_CLOSED
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        where = exc.filename or "its output"
        fix = "the terminal or disk failed" if exc.errno == errno.EIO else "write it where there is room"
        _say(f"{(_command or [prog])[0]}: error: cannot write {where} ({exc.strerror}): {fix}")
        _drop_stdout()
        return CANNOT_WRITE


def run_tool(module: str, argv: list[str] | None, prog: str) -> int:
    """`module`'s main(argv), guarded, the import included (a Ctrl-C while numpy loads is one line too)."""
    return guarded(lambda args: importlib.import_module(module).main(args), argv, prog)
