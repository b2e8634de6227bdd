"""`colibri run IMAGE --place NAME|TAGS`: the run of `colibri run --port URL`, on a board a labgrid place holds.

The place is reserved (waiting up to --place-timeout while someone else holds every matching one), acquired,
its board reset through its power port, and its serial port handed to the --port path (which uploads the image
and runs); it is released on every way out. Errors name the place (the command's name says which).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from colibri.console import Parser
from colibri.farm import FarmError, coordinator_address, read_environment, require_labgrid


def run_on_place(ap: Parser, args: argparse.Namespace, run: Callable[[Parser, argparse.Namespace], int]) -> int:
    """Hold the place `args.place` names, point `args.port` at its serial port, and return run(ap, args)."""
    if args.port:
        ap.error("--place and --port each name the board: give one of them")
    if args.gdb or args.threads > 1:
        ap.error("--gdb and --threads apply to a board colibri run starts, not one on a farm place")
    try:
        require_labgrid()
        env = read_environment(args.lg_env) if args.lg_env else None
    except FarmError as exc:
        return ap.fail(str(exc))
    from colibri.farm.coordinator import Coordinator, quiet_labgrid_logging
    from colibri.farm.place import hold_place
    quiet_labgrid_logging()
    address = (env.coordinator if env and env.coordinator else None) or coordinator_address(args.lg_env)
    quiet = args.json

    def say(line: str) -> None:
        if not quiet:
            print(f"{ap.prog}: {line}", file=sys.stderr, flush=True)
    try:
        with Coordinator(address) as coordinator:
            with hold_place(coordinator, args.place, args.place_timeout, kinds=env.places if env else None,
                            on_wait=say) as held:
                say(f"on place {held.name} ({held.board or 'board kind unknown'}) at {held.url}; {held.reset}")
                args.port, args.baud = held.url, held.baud
                if held.board:
                    args.board = held.board
                ap.prog = f"{ap.prog} (place {held.name})"  # every error of the run names the place
                return run(ap, args)
    except FarmError as exc:
        return ap.fail(str(exc))
