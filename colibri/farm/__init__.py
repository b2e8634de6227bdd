"""Board farms through labgrid (docs/FARM.md): Colibri does not run a farm of its own, it plugs into labgrid's.

- `coordinator.py`: a labgrid client session (places, resources, reservations) usable from plain threads.
- `place.py`: holding a place for one run: reserve it (by name or by tags), acquire it, reset the board through
  the place's power port, hand out its serial port's URL, release it on every way out.
- `export.py`: QEMU boards as farm boards (`colibri farm export`): one QEMU per board, its UART a TCP server
  exported as a `NetworkSerialPort` by labgrid's own exporter, a `NetworkPowerPort` that restarts it, places tagged.
- `verify.py`: one image and prompt on many places at once, each checked against the numpy reference.
- `cli.py`: `colibri farm export|verify|places`; `pytest_plugin.py`: device tests against farm places.

labgrid is an optional extra (`pip install colibri[farm]`): everything here imports it only when it is used.
"""
from __future__ import annotations

import os
import re

DEFAULT_COORDINATOR = "127.0.0.1:20408"  # labgrid's own default

# gRPC's fork handlers (read when grpc is imported) only say, on every child started while a session is open, that
# they skip themselves: the children here exec at once and never use gRPC
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


class FarmError(Exception):
    """A farm problem said to the user in one line (no place matches, the coordinator is down, a place is held)."""


def require_labgrid() -> None:
    """FarmError, in one line, when labgrid is not installed."""
    try:
        import labgrid  # noqa: F401  (only whether it is there)
    except ImportError:
        raise FarmError("board farms need labgrid, which is not installed: pip install 'colibri[farm]' "
                        "(or pip install labgrid)") from None


def check_address(address: object, source: str) -> str:
    """A coordinator address as labgrid 25.0 and later take it (HOST:PORT, HOST, [IPv6]:PORT), or FarmError in one
    line naming where it came from (`source`) and what to write instead."""
    text = str(address).strip()
    if not text:
        raise FarmError(f"{source} is empty: give the coordinator as HOST:PORT (labgrid's default: "
                        f"{DEFAULT_COORDINATOR})")
    from urllib.parse import urlsplit
    old = re.fullmatch(r"wss?://([^/?#]+)([/?#].*)?", text)
    if old:  # crossbar's WAMP URL, labgrid before 25.0
        netloc = old.group(1)
        try:
            instead = netloc if urlsplit(f"//{netloc}").port else f"{netloc}:20408"
        except ValueError:
            instead = DEFAULT_COORDINATOR
        raise FarmError(f"{source}={text} is the form of labgrid before 25.0 (crossbar's URL); since 25.0 the "
                        f"coordinator is gRPC at HOST:PORT: write {instead}")
    try:
        parts = urlsplit(f"//{text}")
        port = parts.port
    except ValueError as exc:
        raise FarmError(f"{source}={text} is not a coordinator address ({exc}): give HOST:PORT, such as "
                        f"{DEFAULT_COORDINATOR}") from None
    if not parts.hostname or parts.path or parts.query or parts.fragment or port == 0 or " " in text:
        raise FarmError(f"{source}={text} is not a coordinator address: give HOST:PORT, such as {DEFAULT_COORDINATOR}")
    return text


def coordinator_address(option: str | None = None, env_file: str | None = None) -> str:
    """Where the coordinator is, as labgrid's own client finds it: `option` (--coordinator), the environment file's
    coordinator_address option (`env_file`, else $LG_ENV), $LG_COORDINATOR, or 127.0.0.1:20408; checked, so a
    malformed one is a FarmError naming where it came from."""
    if option is not None:
        return check_address(option, "--coordinator")
    env_file = env_file or os.environ.get("LG_ENV") or None
    if env_file:
        env = read_environment(env_file)
        if env.coordinator is not None:
            return check_address(env.coordinator, f"coordinator_address in {env_file}")
    if "LG_COORDINATOR" in os.environ:
        return check_address(os.environ["LG_COORDINATOR"], "LG_COORDINATOR")
    return DEFAULT_COORDINATOR


def environment_file(option: str | None) -> str | None:
    """The labgrid environment file: --lg-env, else $LG_ENV (an empty one is none)."""
    return option or os.environ.get("LG_ENV") or None


class Environment:
    """What Colibri reads from a labgrid environment file: the coordinator, and each target's RemotePlace with
    the board kind its options name (`colibri_board`)."""

    def __init__(self, coordinator: str | None, places: dict[str, str | None]):
        self.coordinator = coordinator
        self.places = places  # place name -> board kind (None: from the place's tags, or the board itself)


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (YAML's errors take three)."""
    return " ".join(str(exc).split())


def read_environment(path: str) -> Environment:
    """The file's coordinator and places; FarmError, in one line, when it cannot be read or is not an environment
    file (not a mapping, a RemotePlace without a name)."""
    require_labgrid()
    from labgrid.config import Config
    from labgrid.exceptions import InvalidConfigError, NoConfigFoundError
    from labgrid.factory import target_factory
    said = f"the labgrid environment {path}"
    try:
        try:
            config = Config(path)
        except (TypeError, AttributeError, KeyError):  # YAML, but not a mapping (labgrid reads it as one)
            config = None
        if config is None or not isinstance(config.data, dict):
            raise FarmError(f"{said} is not an environment file: labgrid's is a YAML mapping with targets: and "
                            "options:")
        places: dict[str, str | None] = {}
        targets = config.data.get("targets") or {}
        if not isinstance(targets, dict):
            raise FarmError(f"{said}: its targets: is not a mapping of target names")
        for target, body in targets.items():
            body = body or {}
            if not isinstance(body, dict):
                raise FarmError(f"{said}: target {target} is not a mapping (resources:, options:)")
            resources, _ = target_factory.normalize_config(body)
            options = body.get("options") or {}
            for name, _ in resources.get("RemotePlace", {}).items():
                if not isinstance(name, str) or not name.strip():
                    raise FarmError(f"{said}: target {target}'s RemotePlace has no name: write name: PLACE under it")
                board = options.get("colibri_board") if isinstance(options, dict) else None
                places[name.strip()] = str(board) if board is not None else None
        options = config.data.get("options") or {}
        coordinator = options.get("coordinator_address") if isinstance(options, dict) else None
    except (InvalidConfigError, NoConfigFoundError, OSError, AttributeError, TypeError, ValueError, KeyError) as exc:
        raise FarmError(f"cannot read {said}: {one_line(exc)}") from None
    return Environment(None if coordinator is None else str(coordinator), places)
