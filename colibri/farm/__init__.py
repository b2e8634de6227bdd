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


def coordinator_address(env_file: str | None = None) -> str:
    """Where the coordinator is, as labgrid's own client finds it: the environment file's coordinator_address
    option (--lg-env or $LG_ENV), else $LG_COORDINATOR, else 127.0.0.1:20408."""
    fallback = os.environ.get("LG_COORDINATOR", DEFAULT_COORDINATOR)
    env_file = env_file or os.environ.get("LG_ENV")
    if not env_file:
        return fallback
    return read_environment(env_file).coordinator or fallback


class Environment:
    """What Colibri reads from a labgrid environment file: the coordinator, and each target's RemotePlace with
    the board kind its options name (`colibri_board`)."""

    def __init__(self, coordinator: str | None, places: dict[str, str | None]):
        self.coordinator = coordinator
        self.places = places  # place name -> board kind (None: from the place's tags, or the board itself)


def read_environment(path: str) -> Environment:
    require_labgrid()
    from labgrid.config import Config
    from labgrid.exceptions import InvalidConfigError, NoConfigFoundError
    from labgrid.factory import target_factory
    try:
        config = Config(path)
        places: dict[str, str | None] = {}
        for target, body in (config.get_targets() or {}).items():
            resources, _ = target_factory.normalize_config(body or {})
            for name in resources.get("RemotePlace", {}):
                places[name] = ((body or {}).get("options") or {}).get("colibri_board")
    except (InvalidConfigError, NoConfigFoundError, OSError, AttributeError, TypeError, ValueError) as exc:
        raise FarmError(f"cannot read the labgrid environment {path}: {exc}") from None
    return Environment((config.data.get("options") or {}).get("coordinator_address"), places)
