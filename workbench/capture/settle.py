"""A streamed call's turn recorded while the engine works, not while the harness's next call waits.

A harness that answers at once sends its next call ~0.3-1 ms after ``[DONE]``. The relay used to record the turn
right there (the copy of OpenEnv's ingest, then the call's outcome settled): 450 µs p50 on a 2-core Zen 3 and 320 µs
on Zen 4 (benchmarks/README.md, proxy overhead), so the next request sat behind it, the largest part of the latency
the proxy added. The relay now hands that work to `Settling`, which runs it at the first of:

- the same session's next model call, once that call is forwarded (the engine then tokenises and prefills it:
  20 ms and more), or any call of it that takes OpenEnv's path, before it is served;
- any other request to the proxy (a trace read, a session closed, ``/health``), before it is served;
- `DELAY_S` after ``[DONE]`` (a harness that runs a tool between its calls: every real one);
- `flush` from outside the serving loop (`CaptureProxy.trace`, `CaptureProxy.stop`).

So every reader of the proxy still finds each turn recorded and its call settled, and a session's turns are recorded
in the order their ``[DONE]`` went out (calls of one session can overlap: opencode's title call and its agent's).
Each piece of work runs in the context it was handed in (the call's `current_call`), on the serving loop.

    settling = Settling()
    settling.defer(session_id, lambda: record_turn())     # in the serving loop, right after [DONE]
    settling.flush(session_id)                             # the session's next call is forwarded
    settling.flush()                                       # any other request: every session
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
from collections.abc import Callable

__all__ = ["Settling"]

logger = logging.getLogger("workbench.capture.proxy")


class Settling:
    """The turns recorded later, by session, in order (see module doc). Touched by the serving loop only;
    `flush` from another thread runs there and waits for it."""

    # Long enough for a harness that answers at once to have its next call forwarded first (its request arrives
    # 0.3-1 ms after [DONE]), far shorter than any tool a harness runs between calls.
    DELAY_S = 0.005

    def __init__(self) -> None:
        self._pending: dict[str, list[tuple[contextvars.Context, Callable[[], None]]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def defer(self, session_id: str, work: Callable[[], None]) -> None:
        """Run `work` (it must not raise) later, in the current context; from the serving loop."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._pending.setdefault(session_id, []).append((contextvars.copy_context(), work))
        loop.call_later(self.DELAY_S, self._flush_here, session_id)

    def pending(self, session_id: str | None = None) -> int:
        """How many turns wait to be recorded (of one session, or of all)."""
        if session_id is not None:
            return len(self._pending.get(session_id, ()))
        return sum(len(queue) for queue in self._pending.values())

    def flush(self, session_id: str | None = None, timeout_s: float = 10.0) -> None:
        """Record what waits (one session's, or every session's) now. From the serving loop it runs at once;
        from another thread it runs on that loop while it serves, and this waits for it."""
        loop = self._loop
        if loop is None or not loop.is_running() or _in_loop(loop):
            return self._flush_here(session_id)
        done = asyncio.run_coroutine_threadsafe(self._flush_async(session_id), loop)
        try:
            done.result(timeout_s)
        except concurrent.futures.TimeoutError:
            logger.warning("turns not recorded within %.0f s of a read from another thread", timeout_s)
        except RuntimeError:  # the loop closed between the check and the call: nothing runs there any more
            self._flush_here(session_id)

    async def _flush_async(self, session_id: str | None) -> None:
        self._flush_here(session_id)

    def _flush_here(self, session_id: str | None = None) -> None:
        sessions = list(self._pending) if session_id is None else [session_id]
        for sid in sessions:
            for context, work in self._pending.pop(sid, ()):
                try:
                    context.run(work)
                except Exception:  # the work never raises by contract; one turn lost, never the server
                    logger.exception("[%s] recording a turn failed", sid)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:  # no loop runs in this thread
        return False
