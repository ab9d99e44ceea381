"""The capture proxy's guard against slow clients: deadlines for reading a request, a cap per client address.

uvicorn 0.54 times a connection out only while it idles after a response (``timeout_keep_alive``); a request
that is still arriving is never timed out, and neither is a connection that sends nothing. A client sending one
byte every few seconds kept its socket for as long as it liked, and enough of them used up the file descriptors
of the process hosting the proxy: ``GET /health``, the trainer's control calls and every rollout's model calls
then went unanswered. uvicorn, OpenEnv and TRL have no setting for it (``limit_concurrency`` answers 503 once a
request's head has arrived: it counts the slow connections too and refuses the honest ones). `GuardedProtocol`
is uvicorn's httptools protocol with three rules added (`ConnectionLimits` holds the numbers):

- a request's head must have arrived ``header_timeout_s`` after the connection was made (its first request) or
  after its first byte (a later request on a kept-alive connection); its body ``body_timeout_s`` after the head.
  Otherwise the connection is closed: for the app, the client left (a model call is recorded as such);
- one client address holds at most ``max_waiting_per_client`` connections that are not being served (made,
  reading a request, or kept alive after a response); one more closes the oldest of them: first those whose
  request has not arrived, then kept-alive ones (the trainer's and the harnesses' pooled connections);
- nothing is timed while a request is being answered: a streamed answer can take minutes on a CPU engine.

Every local client (the trainer, a notebook, the sandboxes' relays, a hostile process) shares the address
127.0.0.1, so the cap bounds what slow clients hold rather than telling clients apart; an honest request's head
and body arrive within milliseconds of its connection, long before older slow connections are closed for it.

    guard = ConnectionGuard(ConnectionLimits())          # CaptureProxy(connection_limits=...) makes its own
    uvicorn.Config(app, http=guard.protocol(), ws="none", ...)
    guard.timed_out, guard.evicted                       # connections closed by each rule so far
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from workbench import _compat

__all__ = ["ConnectionLimits", "ConnectionGuard", "GuardedProtocol", "Phase", "descriptor_cap", "RESERVED_DESCRIPTORS"]

_compat.check_uvicorn()  # GuardedProtocol extends uvicorn's methods named in _compat.UVICORN_PROTOCOL_HOOKS

logger = logging.getLogger("workbench.capture.proxy")


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a request may take to arrive, and how many waiting connections one client address may hold.

    None turns a rule off. The defaults:

    - ``header_timeout_s=10``: a request's head is a few hundred bytes sent at once (opencode, httpx); over the
      loopback or through a sandbox's relay it arrives in under 10 ms, so 10 s leaves three orders of magnitude
      for a loaded 2-core machine, and a slow client holds a socket 10 s rather than for ever;
    - ``body_timeout_s=60``: opencode's bodies are 30-300 KB (milliseconds on the loopback); the largest body
      the proxy accepts (32 MiB, ``max_body_bytes``) takes 27 s over a 10 Mbit/s link;
    - ``max_waiting_per_client="auto"``: 256, above what honest clients keep waiting (a sandbox's relay passes at
      most 16 connections; 64 parallel rollouts with two pooled connections each keep 128 alive), or less when the
      process has fewer file descriptors: what is left of its limit when the guard is made, minus
      `RESERVED_DESCRIPTORS` held back for ``GET /health``, the trainer's control calls, authenticated model calls
      and the engine connections behind them (`descriptor_cap`). Under ``prlimit --nofile=256`` the slow
      connections then never take the last descriptor, and ``/health`` keeps answering.
    """

    header_timeout_s: float | None = 10.0
    body_timeout_s: float | None = 60.0
    max_waiting_per_client: int | Literal["auto"] | None = "auto"

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_waiting_per_client"):
            value = getattr(self, name)
            if value is not None and value != "auto" and (isinstance(value, str) or value <= 0):
                raise ValueError(f"ConnectionLimits.{name} must be positive or None, not {value}")


RESERVED_DESCRIPTORS = 64  # kept free of waiting connections: /health, control and model calls, their engine side
_MAX_WAITING = 256


def descriptor_cap(reserved: int = RESERVED_DESCRIPTORS) -> int:
    """The waiting connections one address may hold given this process's descriptors: 256, or what is left of the
    soft RLIMIT_NOFILE (minus those open now) after `reserved`, at least 8."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_WAITING
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 64
    return max(8, min(_MAX_WAITING, soft - open_now - reserved))


class Phase(StrEnum):
    """Where a connection stands; only `SERVING` is exempt from the cap, and only the reading phases are timed."""

    MADE = "made"  # connected, no byte of a request yet: the head's deadline runs from the connection
    READING = "reading"  # a request's head or body is arriving
    SERVING = "serving"  # a whole request has arrived and its answer is not finished
    KEPT = "kept"  # kept alive after an answer (uvicorn's timeout_keep_alive closes it when idle)


class ConnectionGuard:
    """The connections not being served, per client address, oldest first; the protocol class bound to them."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        # the per-address cap in force: as given, or derived from the descriptors left now ("auto")
        self.cap = descriptor_cap() if limits.max_waiting_per_client == "auto" else limits.max_waiting_per_client
        self.timed_out = 0  # connections closed by a deadline
        self.evicted = 0  # connections closed by the per-client cap
        self._unread: dict[str, dict[GuardedProtocol, None]] = {}  # MADE or READING, in arrival order
        self._kept: dict[str, dict[GuardedProtocol, None]] = {}
        self._logged_at = float("-inf")

    def protocol(self) -> type[GuardedProtocol]:
        """The class to give uvicorn (``Config(http=...)``): `GuardedProtocol` bound to this guard."""
        return type("GuardedProtocol", (GuardedProtocol,), {"guard": self})

    def waiting(self) -> int:
        """Connections of every client that are not being served now."""
        return sum(map(len, self._unread.values())) + sum(map(len, self._kept.values()))

    def moved(self, conn: GuardedProtocol) -> None:
        """`conn` entered its current phase: file it (newest last) and close the oldest over the cap."""
        self.forget(conn)
        group = self._unread if conn.phase in (Phase.MADE, Phase.READING) else self._kept
        if conn.phase != Phase.SERVING:
            group.setdefault(conn.address, {})[conn] = None
        cap = self.cap
        unread, kept = self._unread.get(conn.address, {}), self._kept.get(conn.address, {})
        while cap is not None and len(unread) + len(kept) > cap:
            # Never the connection that just moved: it is the newest, and an honest client's next step.
            oldest = next((c for c in (*unread, *kept) if c is not conn), None)
            if oldest is None:
                break
            self.evicted += 1
            self._close(oldest, "more than max_waiting_per_client connections of its address waiting")

    def forget(self, conn: GuardedProtocol) -> None:
        for groups in (self._unread, self._kept):
            group = groups.get(conn.address)
            if group is not None and conn in group:
                del group[conn]
                if not group:
                    del groups[conn.address]

    def expired(self, conn: GuardedProtocol) -> None:
        self.timed_out += 1
        self._close(conn, "its request did not arrive in time")

    def _close(self, conn: GuardedProtocol, why: str) -> None:
        self.forget(conn)
        conn.drop()
        now = time.monotonic()
        if now - self._logged_at > 60:  # one line a minute: an attack would otherwise log a line per socket
            self._logged_at = now
            logger.warning(
                "closed a connection from %s: %s (%d by deadline, %d by the cap so far)",
                conn.address,
                why,
                self.timed_out,
                self.evicted,
            )


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, timed while a request arrives and filed with its `ConnectionGuard`.

    Each extended method calls uvicorn's first (`workbench._compat.UVICORN_PROTOCOL_HOOKS`). A request pipelined
    behind one being answered keeps the connection `SERVING` (never evicted mid-answer) and is not timed until that
    answer is finished: uvicorn stops reading behind a request in flight, so a deadline armed then would run out
    on bytes nobody reads and close the connection under the streamed answer. Once the answer is done, the
    pipelined request gets its full head or body deadline from that moment.
    """

    guard: ConnectionGuard  # set by ConnectionGuard.protocol
    phase: Phase = Phase.MADE
    address = ""
    _reading = False  # a request's head or body is arriving
    _requests = 0  # requests whose body has fully arrived
    _answers = 0  # answers finished
    _head_done = False  # the request arriving now has its whole head
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) else ""
        self._arm(self.guard.limits.header_timeout_s)
        self.guard.moved(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._requests > self._answers:  # pipelined behind an answer in flight: timed once it is finished
            self._disarm()
        elif self._deadline is None:  # a later request; the first one's deadline runs from the connection
            self._arm(self.guard.limits.header_timeout_s)
        self._reading, self._head_done = True, False
        self._settle()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._head_done = True
        if self._requests == self._answers:
            self._arm(self.guard.limits.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._reading = False
        self._requests += 1
        self._settle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._answers += 1
        if self._reading and self._requests == self._answers:  # the pipelined request is next: timed from now
            limits = self.guard.limits
            self._arm(limits.body_timeout_s if self._head_done else limits.header_timeout_s)
        self._settle()

    def drop(self) -> None:
        """Close the connection (the guard's rules); for the app, the client left."""
        self._disarm()
        if not self.transport.is_closing():
            self.transport.close()

    def _settle(self) -> None:
        """The phase from what has arrived and what was answered; a closing connection is only forgotten."""
        if self.transport.is_closing():
            self.guard.forget(self)
            return
        if self._requests > self._answers:
            phase = Phase.SERVING  # an answer in flight: also while a pipelined request arrives behind it
        elif self._reading:
            phase = Phase.READING
        else:
            phase = Phase.KEPT
        self.phase = phase
        self.guard.moved(self)

    def _arm(self, seconds: float | None) -> None:
        self._disarm()
        if seconds is not None:
            self._deadline = self.loop.call_later(seconds, self.guard.expired, self)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
