"""`CpuAccount`: CPU seconds by whom (this process, an engine's process tree, the sandboxes and harnesses this
process started, the rest of the host) while a benchmark's block runs, read from /proc.

    with CpuAccount(engine.proc.pid) as account:   # or CpuAccount() with no engine
        ...
    account.report()   # {"driver+proxy": s, "engine": s, "host": s, "sandboxes+agents": s}
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


class CpuAccount:
    """CPU seconds by whom while a group runs: this process (driver + in-process proxy), the engine's
    process tree (if any), every other descendant (bwrap, opencode) and the rest of the host, from /proc every
    `every_s` (a process that ends between two samples loses at most that much of its time)."""

    def __init__(self, engine_pid: int = -1, every_s: float = 1.0) -> None:
        self.engine_pid, self.every_s = engine_pid, every_s
        self.cpu: dict[int, tuple[str, float]] = {}  # pid: (category, max utime+stime seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CpuAccount":
        self._t0 = time.monotonic()
        self._sample()
        self.baseline = {pid: cpu for pid, (_c, cpu) in self.cpu.items()}  # engine start-up is not the group's
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.wall = time.monotonic() - self._t0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every_s)

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        procs: dict[int, tuple[int, float]] = {}  # pid: (parent, utime+stime)
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2 :].split()
            procs[int(d.name)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / tick)
        for pid, (_parent, cpu) in procs.items():
            category, p = "host", pid
            while p in procs and p > 1:
                if p == self.engine_pid:
                    category = "engine"
                    break
                if p == me:
                    category = "driver+proxy" if pid == me else "sandboxes+agents"
                    break
                p = procs[p][0]
            old = self.cpu.get(pid, (category, 0.0))[1]
            self.cpu[pid] = (category, max(old, cpu))

    def report(self) -> dict[str, float]:
        baseline = self.baseline
        out: dict[str, float] = {}
        for pid, (category, cpu) in self.cpu.items():
            out[category] = out.get(category, 0.0) + cpu - baseline.get(pid, 0.0)
        return {k: round(v, 1) for k, v in sorted(out.items())}
