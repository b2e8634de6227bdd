"""pytest plugin: device tests against labgrid farm places instead of boards started here.

    pytest -p colibri.farm.pytest_plugin --farm-place board=cortex_m55 --farm-place board=riscv64_virt \
        tests/farm_device_checks.py
    pytest -p colibri.farm.pytest_plugin --lg-env farm.yaml tests/farm_device_checks.py     # its RemotePlaces

A test that takes the `farm_place` fixture runs once per place: every place a --farm-place names or whose tags it
matches, or every RemotePlace of the labgrid environment file (labgrid's own --lg-env, or $LG_ENV), as labgrid's
users point their suites at a lab. The coordinator is --farm-coordinator, the environment file's
coordinator_address, $LG_COORDINATOR or 127.0.0.1:20408. Each test holds its place for its own run (reserved,
acquired, the board reset through its power port, released after), so tests of several workers share a farm
the way people do. Without places those tests are skipped, saying how to give them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from colibri.farm import FarmError


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("colibri farm", "device tests on labgrid farm places (colibri.farm.pytest_plugin)")
    group.addoption("--farm-place", action="append", default=[], metavar="NAME|TAGS",
                    help="a place by name, or every place whose tags match (board=cortex_m55); repeatable")
    group.addoption("--farm-coordinator", metavar="HOST:PORT", help="the labgrid coordinator")
    group.addoption("--farm-place-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="how long a test waits for its place while others hold it (default 120)")


def _env_file(config: pytest.Config) -> str | None:
    return getattr(config.option, "lg_env", None) or os.environ.get("LG_ENV")


def _coordinator(config: pytest.Config):
    """One labgrid session for the whole test run (its own thread; closed at the end)."""
    session = getattr(config, "_colibri_farm_coordinator", None)
    if session is None:
        from colibri.farm import coordinator_address, read_environment
        from colibri.farm.coordinator import Coordinator
        env_file = _env_file(config)
        env = read_environment(env_file) if env_file else None
        session = Coordinator(coordinator_address(config.option.farm_coordinator, env_file))
        config._colibri_farm_coordinator = session
        config._colibri_farm_kinds = env.places if env else {}
        config.add_cleanup(session.close)
    return session


def farm_place_names(config: pytest.Config) -> list[str]:
    """The places the run was given, each named once (tag queries expanded at the coordinator)."""
    queries = list(config.option.farm_place)
    env_file = _env_file(config)
    if not queries and env_file:
        from colibri.farm import read_environment
        queries = list(read_environment(env_file).places)
    if not queries:
        return []
    from colibri.farm.place import matching_places
    names: list[str] = []
    for query in queries:
        names += [p.name for p in matching_places(_coordinator(config), query) if p.name not in names]
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "farm_place" not in metafunc.fixturenames:
        return
    try:
        names = farm_place_names(metafunc.config)
    except FarmError as exc:
        raise pytest.UsageError(f"colibri farm: {exc}") from None
    if names:
        metafunc.parametrize("farm_place", names, indirect=True, ids=names)
    else:
        metafunc.parametrize("farm_place", [pytest.param(None, marks=pytest.mark.skip(
            reason="no farm places: give pytest --farm-place NAME|TAGS or --lg-env FILE "
                   "(-p colibri.farm.pytest_plugin)"))], indirect=True, ids=["no-farm"])


@dataclass
class FarmBoard:
    """A farm place held for one test: run images on its board as flash.run_on_board runs them on a local one."""
    name: str
    board: str
    url: str
    baud: int
    reset: str

    def run(self, image: Path, prompt: list[int], max_new: int, sampling=None, want_logits: bool = True,
            upload: str = "auto", timeout: float = 30.0, retries: int = 2):
        """One session on the board (the image uploaded unless the board holds it already): a flash.RunResult."""
        from colibri.farm.place import wait_for_board
        from colibri.farm.verify import board_holds
        from colibri.flash import run_session
        from colibri.protocol import Client, Sampling
        from colibri.sim.launch import open_port
        wait_for_board(self.name, self.url, self.baud)  # after the last run's QUIT, QEMU starts again
        with open_port(self.url, self.baud) as link:
            client = Client(link, timeout=timeout, retries=retries)
            client.info()
            needed = upload == "always" or not board_holds(client, image)
            return run_session(client, image, prompt, max_new, sampling or Sampling(), want_logits, needed)


@pytest.fixture
def farm_place(request: pytest.FixtureRequest):
    """The place this test runs on, held for the test (parametrized over the run's places)."""
    from colibri.farm.place import hold_place
    config = request.config
    try:
        with hold_place(_coordinator(config), request.param, config.option.farm_place_timeout,
                        kinds=config._colibri_farm_kinds) as held:
            yield FarmBoard(held.name, held.board or "", held.url, held.baud, held.reset)
    except FarmError as exc:
        pytest.fail(f"colibri farm: {exc}", pytrace=False)
