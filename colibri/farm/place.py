"""Holding a labgrid place for a run: reserve, acquire, reset, hand out the serial port, release.

A place is asked for by name (`rack-m55-1`) or by tags (`board=cortex_m55`, comma-separated for more than one).
Both go through a labgrid reservation, whose filter matches a place's tags and its name (the tag `name`): the
coordinator allocates a free place to it, or keeps it waiting while every matching place is held, and the wait
ends after the caller's timeout with who holds them. The allocated place is then acquired (its resources are
ours), its board reset through its power port if it has one, and released, with the reservation cancelled, on
every way out (an error, Ctrl-C, SIGTERM).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from colibri.farm import FarmError
from colibri.farm.coordinator import Coordinator, PlaceView, Resource

POLL_S = 0.25  # between polls of a waiting reservation (each poll also keeps it from expiring)
BOOT_WAIT_S = 30.0  # for its board to answer after a reset
# INFO is asked again after each of these in turn, the last repeated: what reaches a board before its UART is set up
# is lost (a QEMU board boots as the first connection comes), so the first tries are short; a Cortex-M under QEMU
# answers its first request after about a second, so the later ones are not
HELLO_TIMEOUTS_S = (0.25, 0.5, 1.0, 2.0)
DEFAULT_POWER_DELAY = 2.0  # labgrid's NetworkPowerDriver: seconds off in a power cycle


def parse_query(text: str) -> dict[str, str]:
    """`NAME` -> {"name": NAME}; `board=cortex_m55[,key=value...]` -> those tags."""
    text = text.strip()
    if not text:
        raise FarmError("an empty place: give a place name or tags such as board=cortex_m55")
    if "=" not in text:
        return {"name": text}
    tags = {}
    for pair in text.split(","):
        key, sep, value = pair.strip().partition("=")
        if not sep or not key or not value:
            raise FarmError(f"{text!r}: give a place name, or tags as key=value[,key=value]")
        if key in tags and tags[key] != value:
            raise FarmError(f"{text!r} asks for a place whose {key} is both {tags[key]} and {value}: give each query "
                            "on its own (farm verify: --boards once for each)")
        tags[key] = value
    return tags


def matches(place: PlaceView, tags: dict[str, str]) -> bool:
    """Whether a reservation filtered by `tags` may get this place (the coordinator's rule: its tags and name)."""
    have = dict(place.tags, name=place.name)
    return all(have.get(k) == v for k, v in tags.items())


def tag_text(tags: dict[str, str]) -> str:
    """Tags as key=value,... in key order (the coordinator keeps no order)."""
    return ",".join(f"{k}={v}" for k, v in sorted(tags.items()))


def describe_query(tags: dict[str, str]) -> str:
    return tags["name"] if list(tags) == ["name"] else ",".join(f"{k}={v}" for k, v in tags.items())


def matching_places(coordinator: Coordinator, query: str) -> list[PlaceView]:
    """Every place a query names or whose tags it matches; FarmError listing the places when there is none."""
    tags = parse_query(query)
    places = coordinator.places()
    found = [p for p in places.values() if matches(p, tags)]
    if not found:
        known = ", ".join(f"{p.name} ({tag_text(p.tags) or 'no tags'})"
                          for p in sorted(places.values(), key=lambda p: p.name)) or "none"
        raise FarmError(f"no place at {coordinator.address} matches {describe_query(tags)}; places: {known}")
    return sorted(found, key=lambda p: p.name)


def holders(places: list[PlaceView], user: str) -> str:
    """Who holds each place, as the user reads it."""
    said = []
    for p in places:
        if p.acquired:
            said.append(f"{p.name} is held by {p.acquired}" + (" (you, in another session)" if p.acquired == user
                                                                else ""))
        elif p.reservation:
            said.append(f"{p.name} is reserved for another client")
        else:
            said.append(f"{p.name} was free at the end")
    return "; ".join(said)


@dataclass(frozen=True)
class HeldPlace:
    """A place this session holds: what a run needs of it."""
    name: str
    board: str | None  # the board kind (its `board` tag, or the environment file's colibri_board), if known
    url: str  # its serial port for pyserial: socket://HOST:PORT (raw) or rfc2217://HOST:PORT
    baud: int
    reset: str  # what was done to reset the board before the run, as the user reads it


def serial_url(resource: Resource) -> str:
    """The pyserial URL of a NetworkSerialPort, through labgrid's proxy manager (an exporter that requires a
    proxy, or $LG_PROXY: an SSH forward)."""
    from labgrid import Target
    from labgrid.factory import target_factory
    from labgrid.util.proxy import proxymanager
    target = Target(f"colibri-{resource.name}")
    port = target_factory.make_resource(target, resource.cls, resource.name, resource.args)
    port.extra = resource.extra
    host, number = proxymanager.get_host_and_port(port)
    protocol = resource.args.get("protocol", "rfc2217")
    if protocol == "raw":
        return f"socket://{host}:{number}"
    if protocol == "rfc2217":
        # as labgrid's SerialDriver: ser2net's RFC 2217 server need not take modem control lines
        return f"rfc2217://{host}:{number}?ign_set_control"
    raise FarmError(f"serial port {resource.name}: unknown protocol {protocol!r} (raw or rfc2217)")


# labgrid's drivers record their calls as steps on one stack for the whole process, which two threads calling at
# once corrupt: each driver call holds this lock (a power cycle's seconds off do not)
_LABGRID_CALLS = threading.Lock()


def power_cycle(place: str, resource: Resource, delay: float) -> None:
    """Off, `delay` seconds, on: labgrid's NetworkPowerDriver on the place's NetworkPowerPort."""
    from labgrid import Target
    from labgrid.driver import NetworkPowerDriver
    from labgrid.factory import target_factory
    target = Target(f"colibri-{place}")
    port = target_factory.make_resource(target, resource.cls, resource.name, resource.args)
    port.extra = resource.extra
    driver = NetworkPowerDriver(target, name=None, delay=delay)
    try:
        with _LABGRID_CALLS:
            target.activate(driver)
            driver.off()
        time.sleep(delay)
        with _LABGRID_CALLS:
            driver.on()
    except Exception as exc:  # the backend's own errors: HTTP, SNMP, a socket
        raise FarmError(f"place {place}: resetting the board through its power port failed: "
                        f"{exc or type(exc).__name__}") from None
    finally:
        with _LABGRID_CALLS:
            target.deactivate_all_drivers()


def wait_for_board(place: str, url: str, baud: int, timeout: float = BOOT_WAIT_S) -> str:
    """Until the board answers INFO; the board's name as it says it. After a reset its serial server may not take
    connections yet (a QEMU restarting), what the board sends while it boots is not the protocol, and what reaches
    it before its UART is set up is lost: so the port is opened again while it fails, and INFO asked again after
    each of HELLO_TIMEOUTS_S."""
    from colibri.protocol import Client, LinkClosed, LinkError
    from colibri.sim.launch import open_port
    deadline = time.monotonic() + timeout
    problem = ""
    while time.monotonic() < deadline:
        try:
            with open_port(url, baud) as link:
                for attempt in range(1 << 30):
                    wait = HELLO_TIMEOUTS_S[min(attempt, len(HELLO_TIMEOUTS_S) - 1)]
                    try:
                        return Client(link, timeout=wait, retries=0).info().board
                    except LinkClosed as exc:  # a QEMU on its way out: open it again
                        problem = str(exc)
                        break
                    except LinkError as exc:
                        problem = str(exc)
                        if time.monotonic() > deadline:
                            break
        except LinkError as exc:  # could not open it, or it closed: the server is not there yet
            problem = str(exc)
        time.sleep(0.1)
    raise FarmError(f"place {place}: its board did not answer at {url} within {timeout:g} s of its reset "
                    f"({problem.splitlines()[0] if problem else 'no answer'})")


def pick(resources: list[Resource], cls: str, preferred: str) -> Resource | None:
    """The place's resource of this class named `preferred`, else its first one of the class."""
    of_class = [r for r in resources if r.cls == cls]
    return next((r for r in of_class if r.name == preferred), of_class[0] if of_class else None)


class Holdings:
    """The reservations and places the threads of one command hold, so the main thread can give them all back
    when the command is stopped (Ctrl-C, SIGTERM) while the threads still wait on their boards."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens: set[str] = set()
        self.places: set[str] = set()

    def add(self, token: str | None = None, place: str | None = None) -> None:
        with self._lock:
            self.tokens |= {token} - {None}
            self.places |= {place} - {None}

    def drop(self, token: str | None = None, place: str | None = None) -> None:
        with self._lock:
            self.tokens.discard(token)
            self.places.discard(place)

    def release_all(self, coordinator: Coordinator) -> None:
        with self._lock:
            places, tokens = list(self.places), list(self.tokens)
            self.places.clear()
            self.tokens.clear()
        for place in places:
            try:
                coordinator.release(place)
            except FarmError:
                pass
        for token in tokens:
            try:
                coordinator.cancel(token)
            except FarmError:
                pass


@contextmanager
def hold_place(coordinator: Coordinator, query: str, wait: float, reset: bool = True,
               kinds: dict[str, str | None] | None = None,
               on_wait: Callable[[str], None] | None = None, holdings: Holdings | None = None) -> Iterator[HeldPlace]:
    """Reserve a place matching `query`, waiting up to `wait` seconds while all are held, acquire it, reset its
    board through its power port (if it has one and `reset`), and yield it; release it and cancel the reservation
    on the way out. `kinds`: board kinds by place name from an environment file. `on_wait` hears once that the
    run waits, and for what."""
    candidates = matching_places(coordinator, query)
    tags = parse_query(query)
    holdings = holdings or Holdings()
    token = coordinator.reserve(tags)
    holdings.add(token=token)
    try:
        deadline = time.monotonic() + wait
        said = False
        while (name := coordinator.allocation(token)) is None:
            if time.monotonic() >= deadline:
                now = [p for p in coordinator.places().values() if p.name in {c.name for c in candidates}]
                raise FarmError(f"no place matching {describe_query(tags)} came free in {wait:g} s: "
                                f"{holders(now, coordinator.user)}")
            if on_wait and not said:
                on_wait(f"waiting up to {wait:g} s for a place matching {describe_query(tags)} "
                        f"({holders(candidates, coordinator.user)})")
                said = True
            time.sleep(POLL_S)
        coordinator.acquire(name)
        holdings.add(place=name)
        try:
            yield prepare(coordinator, name, reset, kinds or {})
        finally:
            holdings.drop(place=name)
            try:
                coordinator.release(name)
            except FarmError:
                pass  # the place was deleted, or the coordinator went away: nothing is held any more
    finally:
        holdings.drop(token=token)
        try:
            coordinator.cancel(token)
        except FarmError:
            pass


def prepare(coordinator: Coordinator, name: str, reset: bool, kinds: dict[str, str | None]) -> HeldPlace:
    """An acquired place made ready for a run: its serial port found, its board reset."""
    resources = coordinator.acquired_resources(name)
    serial = pick(resources, "NetworkSerialPort", "console")
    if serial is None and not resources:  # the coordinator drops an exporter's resources when it goes
        matched = coordinator.places()[name].matches
        if not matched:
            raise FarmError(f"place {name} matches no resources: give it its board's with labgrid-client -p {name} "
                            "add-match EXPORTER/GROUP/*")
        exporters = ", ".join(sorted({m.split("/")[0] for m in matched}))
        raise FarmError(f"place {name}: its exporter is offline (its serial port is not available): start "
                        f"exporter {exporters} again (colibri farm export, or labgrid-exporter on the boards' host)")
    if serial is None:
        have = ", ".join(sorted({r.cls for r in resources}))
        raise FarmError(f"place {name} has no NetworkSerialPort to talk to its board over (its resources: {have})")
    if not serial.avail:
        raise FarmError(f"place {name}: its serial port is not available (its exporter lost it)")
    url = serial_url(serial)
    tags = coordinator.places()[name].tags
    power = pick(resources, "NetworkPowerPort", "power")
    done = "not reset (the place has no power port)"
    if power is not None and reset:
        try:
            delay = float(tags.get("power_delay", DEFAULT_POWER_DELAY))
        except ValueError:
            delay = DEFAULT_POWER_DELAY
        power_cycle(name, power, delay)
        done = f"reset by power cycling ({delay:g} s off)"
    elif power is not None:
        done = "not reset (asked not to)"
    baud = int(serial.args.get("speed") or 115200)
    said = wait_for_board(name, url, baud)
    return HeldPlace(name, tags.get("board") or kinds.get(name) or said, url, baud, done)
