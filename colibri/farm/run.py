"""`colibri run IMAGE --place NAME|TAGS`: the run of `colibri run --port URL`, on a board a labgrid place holds.

colibri run checks its own arguments first (the image, the prompt, the tokens against max_seq), then asks the
coordinator which places match and what board they are (their `board` tag, or the environment file's
colibri_board) and checks the image and its arena against that board's memory, all before anything is reserved.
Only then is the place reserved (waiting up to --place-timeout while someone else holds every matching one),
acquired, its board reset through its power port, and its serial port handed to the --port path (which uploads the
image and runs); it is released on every way out (the end, an error, Ctrl-C, SIGTERM, SIGHUP). Errors after that
name the place (the command's name says which).
"""
from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING

from colibri.console import Parser
from colibri.farm import coordinator_address, environment_file, read_environment, require_labgrid
from colibri.farm.place import HeldPlace
from colibri.image import Image

if TYPE_CHECKING:
    from colibri.farm.coordinator import Coordinator


def check_board(img: Image, image_bytes: int, kind: str | None, prompt: list[int] | None, max_new: int,
                slots: int) -> str | None:
    """flash.preflight against a board kind, when it is one Colibri knows (a real board's tag may name another)."""
    from colibri.flash import preflight
    from colibri.sim.boards import board_names, load_board
    try:
        board = load_board(kind) if kind and kind in board_names() else None
    except ValueError:
        board = None
    return preflight(img, image_bytes, board, prompt, max_new, slots) if board else None


class FarmPlace:
    """colibri run's --place: looked up before the run, held for the run only. close() gives back what it holds."""

    def __init__(self, ap: Parser, args: argparse.Namespace):
        """The flags that cannot go with --place are refused here, at once (argument errors)."""
        if args.port:
            ap.error("--place and --port each name the board: give one of them")
        if args.gdb or args.threads > 1:
            ap.error("--gdb and --threads apply to a board colibri run starts, not one on a farm place")
        self.ap, self.args = ap, args
        self.query: str = args.place
        self.kinds: dict[str, str | None] = {}
        self.held: HeldPlace | None = None
        self._stack = ExitStack()
        self._coordinator: Coordinator | None = None

    def board_kind(self) -> str | None:
        """Connect to the coordinator and say the board kind of every place the query matches (their `board` tag,
        else the environment file's colibri_board), None when they differ or it is not known. FarmError in one
        line: labgrid missing, a bad environment file or coordinator address, no coordinator, no such place."""
        require_labgrid()
        env_file = environment_file(self.args.lg_env)
        env = read_environment(env_file) if env_file else None
        self.kinds = env.places if env else {}
        address = coordinator_address(None, env_file)
        from colibri.farm.coordinator import Coordinator, quiet_labgrid_logging
        from colibri.farm.place import matching_places
        quiet_labgrid_logging()
        self._coordinator = self._stack.enter_context(Coordinator(address))
        found = {p.tags.get("board") or self.kinds.get(p.name)
                 for p in matching_places(self._coordinator, self.query)}
        return found.pop() if len(found) == 1 else None

    def take(self, img: Image, image_bytes: int, prompt: list[int] | None, max_new: int, slots: int) -> str | None:
        """The image checked against the board of the matching places (its region, the arena it needs), then the
        place held and, when its board turns out to be another kind, checked against that one: the problem, as the
        user reads it (whatever is held is given back by close()), or None with the place held."""
        kind = self.board_kind()
        problem = check_board(img, image_bytes, kind, prompt, max_new, slots)
        if problem:
            return problem
        held = self.hold()
        return check_board(img, image_bytes, held.board, prompt, max_new, slots) if held.board != kind else None

    def hold(self) -> HeldPlace:
        """Reserve, acquire and reset the place (saying on stderr, unless --json, that it waits and where it runs);
        held until close()."""
        from colibri.farm.place import hold_place
        quiet = self.args.json

        def say(line: str) -> None:
            if not quiet:
                print(f"{self.ap.prog}: {line}", file=sys.stderr, flush=True)
        self.held = self._stack.enter_context(hold_place(self._coordinator, self.query, self.args.place_timeout,
                                                         kinds=self.kinds, on_wait=say))
        held = self.held
        say(f"on place {held.name} ({held.board or 'board kind unknown'}) at {held.url}; {held.reset}")
        self.args.port, self.args.baud = held.url, held.baud
        if held.board:
            self.args.board = held.board
        self.ap.prog = f"{self.ap.prog} (place {held.name})"  # every error of the run names the place
        return held

    def close(self) -> None:
        """Release the place, cancel the reservation, end the session with the coordinator."""
        self._stack.close()

