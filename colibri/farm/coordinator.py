"""A labgrid client session with plain, blocking methods that any thread may call.

labgrid's ClientSession is asyncio code driven by whoever runs its event loop; `labgrid-client` runs it for one
command at a time. Colibri holds places while serial sessions run in threads (a farm run drives many boards at
once), so the session's loop runs in a thread of its own for the session's life and every call is handed to it:
the coordinator's updates (places taken and released, resources appearing) keep arriving while boards run.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any, Coroutine, TypeVar

from colibri.farm import FarmError, require_labgrid

T = TypeVar("T")
CALL_TIMEOUT = 30.0  # one coordinator request; it answers in milliseconds when it is there


@dataclass(frozen=True)
class PlaceView:
    """What the coordinator says of a place, copied out of the session (which its loop thread updates)."""
    name: str
    tags: dict[str, str]
    acquired: str | None  # "host/user" of whoever holds it
    reservation: str | None
    matches: tuple[str, ...]  # exporter/group/cls patterns


@dataclass(frozen=True)
class Resource:
    """One resource of an acquired place: its class (NetworkSerialPort, NetworkPowerPort, ...), its name in the
    place, and its parameters as the exporter published them."""
    name: str
    cls: str
    args: dict[str, Any]
    extra: dict[str, Any]
    avail: bool


def quiet_labgrid_logging() -> None:
    """labgrid's client logs to the root logger (`coordinator is unavailable`); in a command those lines would
    stand beside our one-line error, so with no handler set up they go nowhere."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


class Coordinator:
    """A session with the labgrid coordinator at `address` (HOST:PORT). Close it (or use `with`)."""

    def __init__(self, address: str):
        require_labgrid()
        self.address = address
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="labgrid-session", daemon=True)
        self._thread.start()
        self.session = None
        try:
            self.session = self._call(self._start(), timeout=CALL_TIMEOUT)
        except BaseException:
            self.close()
            raise

    async def _start(self):
        from labgrid.remote.client import ClientSession, Error
        from labgrid.util.proxy import ProxyError, proxymanager
        try:
            grpc_address = proxymanager.get_grpc_address(self.address, default_port=20408)
        except (ProxyError, ValueError) as exc:
            raise FarmError(f"{self.address} is not a coordinator address ({exc}): give HOST:PORT") from None
        session = ClientSession(grpc_address, self.loop)
        try:
            await session.start()
        except Error:
            await session.close()
            raise FarmError(f"no labgrid coordinator answers at {self.address} (start one with "
                            "labgrid-coordinator, or set LG_COORDINATOR)") from None
        return session

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
        except TimeoutError:
            raise FarmError(f"the labgrid coordinator at {self.address} did not answer in {timeout:.0f} s") from None

    def _rpc(self, method: str, request) -> Any:
        """One coordinator request, then a sync, so the session's view includes what it changed."""
        import grpc

        async def call():
            try:
                response = await getattr(self.session.stub, method)(request)
            except grpc.aio.AioRpcError as exc:
                raise FarmError(f"the coordinator refused {method}: {exc.details()}") from None
            await self.session.sync_with_coordinator()
            return response
        return self._call(call())

    def close(self) -> None:
        if self.session is not None:
            async def stop():
                await self.session.stop()
                await self.session.close()
            try:
                self._call(stop(), timeout=5.0)
            except Exception:  # noqa: BLE001  (closing: the coordinator may be gone already)
                pass
            self.session = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5.0)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def user(self) -> str:
        """Who this session acquires places as (labgrid's "host/user"; $LG_HOSTNAME and $LG_USERNAME)."""
        return f"{self.session.gethostname()}/{self.session.getuser()}"

    def sync(self) -> None:
        self._call(self.session.sync_with_coordinator())

    # ---- places ----
    def places(self) -> dict[str, PlaceView]:
        async def copy():
            return {name: PlaceView(name, dict(p.tags), p.acquired, p.reservation, tuple(repr(m) for m in p.matches))
                    for name, p in self.session.places.items()}
        return self._call(copy())

    def create_place(self, name: str) -> None:
        """A new, empty place; FarmError when one of that name exists (it is someone's: never taken over)."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        self._rpc("AddPlace", pb.AddPlaceRequest(name=name))

    def set_up_place(self, name: str, tags: dict[str, str], matches: list[str], comment: str = "") -> None:
        """Give a place (one this session created) its resource matches (exporter/group/cls patterns), tags and
        comment."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        have = self.places()[name].matches
        for pattern in matches:
            if pattern not in have:
                self._rpc("AddPlaceMatch", pb.AddPlaceMatchRequest(placename=name, pattern=pattern))
        self._rpc("SetPlaceTags", pb.SetPlaceTagsRequest(placename=name, tags=tags))
        if comment:
            self._rpc("SetPlaceComment", pb.SetPlaceCommentRequest(placename=name, comment=comment))

    def delete_place(self, name: str) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        self._rpc("DeletePlace", pb.DeletePlaceRequest(name=name))

    def resources(self, exporter: str | None = None) -> dict[tuple[str, str, str], Resource]:
        """Every resource the coordinator knows: (exporter, group, name) -> Resource."""
        async def copy():
            return {(e, g, n): Resource(n, r.cls, dict(r.args), dict(r.extra or {}), bool(r.avail))
                    for e, groups in self.session.resources.items() if exporter in (None, e)
                    for g, group in groups.items() for n, r in group.items() if "cls" in r.data}
        return self._call(copy())

    def exporter_connected(self, exporter: str) -> bool:
        """Whether an exporter of this name is connected (the coordinator drops an exporter's resources when it
        goes, so one with resources is there)."""
        self.sync()
        return bool(self.resources(exporter))

    # ---- reservations and acquiring ----
    def reserve(self, tags: dict[str, str]) -> str:
        """A reservation for one place whose tags (and name, as the tag `name`) include `tags`: its token."""
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        request = pb.CreateReservationRequest(filters={"main": pb.Reservation.Filter(filter=tags)}, prio=0.0)
        return self._rpc("CreateReservation", request).reservation.token

    def allocation(self, token: str) -> str | None:
        """The place the coordinator allocated to a reservation, None while it waits (polling keeps it alive)."""
        from labgrid.remote.common import Reservation, ReservationState
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        res = Reservation.from_pb2(self._rpc("PollReservation", pb.PollReservationRequest(token=token)).reservation)
        if res.state in (ReservationState.expired, ReservationState.invalid):
            raise FarmError(f"the coordinator dropped reservation {token} ({res.state.name})")
        return res.allocations["main"][0] if res.allocations.get("main") else None

    def reservations(self) -> list[tuple[str, str, str]]:
        """Every reservation the coordinator keeps: (token, owner, state)."""
        from labgrid.remote.common import Reservation
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        found = self._rpc("GetReservations", pb.GetReservationsRequest()).reservations
        return [(r.token, r.owner, r.state.name) for r in map(Reservation.from_pb2, found)]

    def cancel(self, token: str) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        self._rpc("CancelReservation", pb.CancelReservationRequest(token=token))

    def acquire(self, place: str) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        self._rpc("AcquirePlace", pb.AcquirePlaceRequest(placename=place))

    def release(self, place: str) -> None:
        from labgrid.remote.generated import labgrid_coordinator_pb2 as pb
        self._rpc("ReleasePlace", pb.ReleasePlaceRequest(placename=place))

    def acquired_resources(self, place: str) -> list[Resource]:
        """The resources of a place this session holds, under their names in the place."""
        async def copy():
            p = self.session.places[place]
            entries = self.session.get_target_resources(p)
            return [Resource(name, r.cls, dict(r.args), dict(r.extra or {}), bool(r.avail))
                    for (name, _), r in entries.items()]
        try:
            return self._call(copy())
        except Exception as exc:  # labgrid's UserError/ServerError: an orphaned resource, an exporter gone
            raise FarmError(f"place {place}: {exc}") from None
