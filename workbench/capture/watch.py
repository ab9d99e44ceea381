"""The engines behind a proxy with several (``CaptureProxy(replicas=...)``), watched: one that stops answering is
drained, its sessions moved to the others, and restored when it answers again.

A thread asks each engine for ``/v1/models`` (with its key) every `period_s`; `failures` misses in a row (a refused
or reset connection, a timeout, a status other than 200) drain it (`workbench.capture.openenv._Replicas.drain`: no
new session is pinned to it, its live sessions' next calls go to the least busy open engine), one answer restores
it. A call in flight on an engine that died fails; its rollout ends ``replica_lost`` (unscored, never 0) and
`workbench.rollout.run_rollouts` runs it again; sessions pinned later never reach that engine. Defaults: a dead
engine (its connections refused at once) is drained within ~3 s; one slower than 5 s to list its models three times
in a row is drained too (not measured how often a loaded engine does that; a wrong drain moves sessions, losing their
prefix cache, not their rollouts).

    watch = ReplicaWatch(replicas).start()     # CaptureProxy.start does this when it has replicas
    watch.stop()
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from workbench.capture.openenv import _Replicas

__all__ = ["ReplicaWatch"]


class ReplicaWatch:
    """Drains and restores the engines of a `_Replicas` by asking each whether it answers."""

    def __init__(self, replicas: _Replicas, *, period_s: float = 1.0, failures: int = 3, timeout_s: float = 5.0):
        self.replicas, self.period_s, self.failures, self.timeout_s = replicas, period_s, failures, timeout_s
        self.misses = [0] * len(replicas.engines)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)

    def start(self) -> ReplicaWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.period_s + 1)

    def check(self, http: httpx.Client) -> None:
        """One round: ask every engine once, drain or restore by the answer."""
        for index, engine in enumerate(self.replicas.engines):
            try:
                ok = http.get(f"{engine.url}/v1/models", headers=engine.headers).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.misses[index] = 0 if ok else self.misses[index] + 1
            if ok and index in self.replicas.drained:
                self.replicas.restore(index)
            elif self.misses[index] >= self.failures and index not in self.replicas.drained:
                self.replicas.drain(index)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            while not self._stop.wait(self.period_s):
                self.check(http)
