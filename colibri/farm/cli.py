"""`colibri farm`: boards reached through a labgrid coordinator (docs/FARM.md).

  colibri farm export --boards cortex_m55,riscv64_virt        QEMU boards exported as labgrid places, until Ctrl-C
  colibri farm places                                         every place: its board, tags, who holds it
  colibri farm verify model.img --boards board=cortex_m55 --boards board=riscv64_virt --prompt-tokens 1,2,3
                                                              the same run on every matching place, in parallel

The coordinator is found as labgrid's own client finds it: --coordinator, the environment file's
coordinator_address (--lg-env or $LG_ENV), $LG_COORDINATOR, or 127.0.0.1:20408. `colibri run IMAGE --place NAME`
(or --place board=cortex_m55) runs on one place. labgrid is an optional extra: pip install 'colibri[farm]'.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from colibri.console import Parser, name_command
from colibri.farm import FarmError, coordinator_address, environment_file, read_environment, require_labgrid


def split_boards(values: list[str]) -> list[str]:
    return [b.strip() for v in values for b in v.split(",") if b.strip()]


def export_main(argv: list[str], prog: str) -> int:
    ap = Parser("Start one QEMU per board with the Colibri firmware and export each board's serial console (a labgrid "
                "NetworkSerialPort) and power switch (a NetworkPowerPort that restarts it) to a labgrid coordinator, "
                "with a place per board tagged board=<kind>. Runs until Ctrl-C or SIGTERM, then stops the boards "
                "and deletes the places.", prog=prog)
    ap.add_argument("--boards", action="append", required=True, metavar="BOARD[,BOARD...]",
                    help="QEMU boards to export (a board twice gives two places); repeatable")
    ap.add_argument("--coordinator", metavar="HOST:PORT", help="the labgrid coordinator (default: $LG_COORDINATOR, "
                                                              "else 127.0.0.1:20408)")
    ap.add_argument("--name", default="qemu", help="the exporter's name, and its places' prefix (default qemu: "
                                                   "places qemu-<board>)")
    ap.add_argument("--image", type=Path, help="an image QEMU's loader puts on every board at each start, so runs "
                                               "of that image need no upload")
    ap.add_argument("--host", default="127.0.0.1",
                    help="the address QEMU's serial servers and the power switch listen on, as clients reach it "
                         "(default 127.0.0.1: this machine only)")
    ap.add_argument("--keep-places", action="store_true", help="leave the places at the coordinator on exit")
    args = ap.parse_args(argv)
    from colibri.build import BuildError, ensure_built
    from colibri.sim.boards import board_names, load_board
    kinds = split_boards(args.boards)
    try:
        boards = [load_board(k) for k in kinds]
    except ValueError as exc:
        return ap.fail(str(exc))
    not_qemu = [b.name for b in boards if b.spec["link"] != "qemu"]
    if not_qemu:
        qemu = [n for n in board_names() if load_board(n).spec["link"] == "qemu"]
        return ap.fail(f"{', '.join(not_qemu)} {'is' if len(not_qemu) == 1 else 'are'} not a QEMU board; farm export "
                       f"runs QEMU boards: {', '.join(qemu)}")
    if args.image is not None:
        problem = preload_problem(args.image, boards)
        if problem:
            return ap.fail(problem)
    try:
        require_labgrid()  # before a build that would be for nothing
        address = coordinator_address(args.coordinator)
    except FarmError as exc:
        return ap.fail(str(exc))
    from colibri.farm.coordinator import Coordinator, quiet_labgrid_logging
    from colibri.farm.export import QemuFarm, check_names, place_names
    quiet_labgrid_logging()
    try:  # the coordinator there, the names free: before a build (QemuFarm checks them again as it starts)
        with Coordinator(address) as coordinator:
            check_names(coordinator, args.name, place_names(args.name, kinds))
        firmwares = {b.name: ensure_built(b) for b in boards}
    except (FarmError, BuildError) as exc:
        return ap.fail(str(exc))
    try:
        with QemuFarm(address, boards, [firmwares[b.name] for b in boards], args.image, args.name, args.host,
                      args.keep_places) as farm:
            rows = [("place", "board", "serial port", "power")] + [
                (e.place, e.board, e.serial, e.power) for e in farm.exported()]
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            for r in rows:
                print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
            if farm.reused:
                print(f"places already at the coordinator, used as they are (not retagged, kept on exit): "
                      f"{', '.join(farm.reused)}")
            preload = f", {args.image.name} preloaded" if args.image else ""
            print(f"farm ready: {len(boards)} board{'s' if len(boards) > 1 else ''} exported as {args.name} to the "
                  f"coordinator at {address}{preload}; Ctrl-C stops them", flush=True)
            farm.wait()
    except FarmError as exc:
        return ap.fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: how a farm is meant to stop; the boards are stopped by now
        try:
            print(f"farm stopped: {len(boards)} board{'s' if len(boards) > 1 else ''} and "
                  f"{'their places' if not args.keep_places else 'their processes (places kept)'} gone", flush=True)
        except OSError:  # a terminal closed (SIGHUP)
            pass
    return 0


def preload_problem(image: Path, boards: list) -> str | None:
    """Why `farm export --image` cannot preload this file on these boards (not a file, not a Colibri image, larger
    than a board's image region or needing more arena than it has), as the user reads it; None when it can."""
    if not image.is_file():
        return f"image {image} not found; make one with colibri pack"
    from colibri.flash import preflight
    from colibri.image import ImageError, open_image
    try:
        img = open_image(image, check_crcs=False)
    except ImageError as exc:
        return f"{image} is not a valid image ({exc}); make one with colibri pack"
    for board in boards:
        problem = preflight(img, image.stat().st_size, board, None, 0, 0)
        if problem:
            return f"--image {image.name} cannot be preloaded on {board.name}: {problem}"
    return None


def places_main(argv: list[str], prog: str) -> int:
    ap = Parser("Every place at the coordinator: its board kind, tags and who holds it.", prog=prog)
    ap.add_argument("--coordinator", metavar="HOST:PORT")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from colibri.farm.coordinator import Coordinator, quiet_labgrid_logging
    from colibri.farm.place import tag_text
    quiet_labgrid_logging()
    try:
        with Coordinator(coordinator_address(args.coordinator)) as c:
            places = sorted(c.places().values(), key=lambda p: p.name)
    except FarmError as exc:
        return ap.fail(str(exc))
    if args.json:
        print(json.dumps([{"place": p.name, "tags": p.tags, "acquired": p.acquired} for p in places]))
        return 0
    rows = [("place", "board", "tags", "held by")] + [
        (p.name, p.tags.get("board", "?"), tag_text({k: v for k, v in p.tags.items() if k != "board"}) or "-",
         p.acquired or "-") for p in places]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
    return 0


def verify_main(argv: list[str], prog: str) -> int:
    from colibri.flash import parse_tokens
    ap = Parser("Run one image and prompt on many farm places in parallel, each checked against the numpy reference "
                "bit for bit; one table (place, board, tokens/s, logits, verdict). Exit status 0 when every board "
                "agrees, 1 when any differs or fails.", prog=prog)
    ap.add_argument("image", type=Path)
    ap.add_argument("--boards", action="append", metavar="PLACES|TAGS",
                    help="places by name (a,b,c) or every place whose tags match (board=cortex_m55); repeatable")
    ap.add_argument("--lg-env", metavar="FILE", help="a labgrid environment file: every RemotePlace in it (and its "
                                                     "coordinator_address); default $LG_ENV when no --boards")
    ap.add_argument("--coordinator", metavar="HOST:PORT")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt-tokens", type=parse_tokens, help="comma-separated token ids")
    what.add_argument("--prompt", metavar="TEXT", help="a prompt in words, encoded with the image's tokenizer")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--place-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long to wait for a place someone else holds (default 60)")
    ap.add_argument("--timeout", type=float, default=30.0,
                    help="seconds to wait for a board's answer before asking again (default 30)")
    ap.add_argument("--retries", type=int, default=2, help="times a request is sent again before the board counts "
                                                           "as failed (default 2)")
    ap.add_argument("--upload", choices=("auto", "always"), default="auto",
                    help="auto (default): upload unless the board already holds the image; always")
    ap.add_argument("--jobs", type=int, default=0, help="places run at once (default 0: all)")
    ap.add_argument("--no-reset", action="store_true", help="do not power cycle the boards before the run")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 0 or args.jobs < 0 or args.place_timeout < 0:
        ap.error("--max-new-tokens, --jobs and --place-timeout take a number >= 0")
    env_file = environment_file(args.lg_env)  # its places when no --boards; its colibri_board always
    if not args.boards and not env_file:
        ap.error("say which places: --boards (names or tags such as board=cortex_m55) or --lg-env FILE")
    if not args.image.is_file():
        return ap.fail(f"image {args.image} not found; make one with colibri pack")
    from colibri.image import ImageError, open_image
    try:
        img = open_image(args.image, check_crcs=False)
    except ImageError as exc:
        return ap.fail(f"{args.image} is not a valid image ({exc}); make one with colibri pack")
    prompt = args.prompt_tokens
    if prompt is None:
        from colibri.text import NoTokenizer, Text
        try:
            prompt = Text(img.meta).encode(args.prompt)
        except NoTokenizer as exc:
            return ap.fail(str(exc))
    from colibri.flash import preflight
    problem = preflight(img, args.image.stat().st_size, None, prompt, args.max_new_tokens, 0)
    if problem:
        return ap.fail(problem)
    try:
        require_labgrid()
        env = read_environment(env_file) if env_file else None
        address = coordinator_address(args.coordinator, env_file)
    except FarmError as exc:
        return ap.fail(str(exc))
    from colibri.farm.coordinator import Coordinator, quiet_labgrid_logging
    from colibri.farm.place import matching_places
    from colibri.farm.run import check_board
    from colibri.farm.verify import farm_verify, table
    quiet_labgrid_logging()
    kinds = env.places if env else {}
    started = time.perf_counter()
    try:
        with Coordinator(address) as coordinator:
            names: list[str] = []
            boards: dict[str, str | None] = {}  # the board kind each place is known to be, before it is held
            for query in ([q for v in args.boards for q in ([v] if "=" in v else v.split(","))] if args.boards
                          else list(kinds)):
                for p in matching_places(coordinator, query):
                    if p.name not in names:
                        names.append(p.name)
                        boards[p.name] = p.tags.get("board") or kinds.get(p.name)
            if not names:
                return ap.fail(f"the environment file {env_file} names no RemotePlace")
            for kind in dict.fromkeys(b for b in boards.values() if b):  # refused before any place is held
                problem = check_board(img, args.image.stat().st_size, kind, prompt, args.max_new_tokens, 0)
                if problem:
                    on = [n for n in names if boards[n] == kind]
                    return ap.fail(f"place{'s' if len(on) > 1 else ''} {', '.join(on)}: {problem}")
            runs = farm_verify(coordinator, names, args.image, prompt, args.max_new_tokens, wait=args.place_timeout,
                               timeout=args.timeout, retries=args.retries, upload=args.upload, jobs=args.jobs,
                               kinds=kinds, reset=not args.no_reset, boards=boards)
    except FarmError as exc:
        return ap.fail(str(exc))
    wall = time.perf_counter() - started
    passed = sum(r.passed for r in runs)
    ok = passed == len(runs)
    if args.json:  # written (flushed) before the verdict: output that cannot be written is the one line said
        print(json.dumps({"image": str(args.image), "prompt_tokens": prompt, "max_new_tokens": args.max_new_tokens,
                          "seconds": round(wall, 3), "passed": ok, "places": [r.as_json() for r in runs]}), flush=True)
    else:
        for line in table(runs):
            print(line)
    print(f"farm verify: {passed} of {len(runs)} places bit-identical to the reference over {len(prompt)} prompt + "
          f"{args.max_new_tokens} new tokens in {wall:.1f} s: {'PASS' if ok else 'FAIL'}",
          file=sys.stderr if args.json else sys.stdout, flush=True)
    return 0 if ok else 1


COMMANDS = {"export": export_main, "verify": verify_main, "places": places_main}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = sys.argv[0] if sys.argv[0].startswith("colibri") else "colibri farm"
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] not in COMMANDS:
        print(f"{prog}: error: unknown command {args[0]!r}; choose from {', '.join(COMMANDS)} ({prog} --help)",
              file=sys.stderr)
        return 2
    name_command(f"{prog} {args[0]}")  # `colibri farm verify: interrupted`
    return COMMANDS[args[0]](args[1:], f"{prog} {args[0]}")


if __name__ == "__main__":
    sys.exit(main())
