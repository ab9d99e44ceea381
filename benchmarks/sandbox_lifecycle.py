"""Sandbox start and cleanup: start latency with and without bubblewrap, and what 100 sessions leave behind.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sandbox_lifecycle.py             # 100 sessions per mode, ~1 min
    .venv/bin/python benchmarks/sandbox_lifecycle.py --sessions 20 --isolation none

Each session is one `workbench.sandbox.session.Sandbox`: ``Sandbox.create`` (workspace with one task file, HOME/XDG
dirs, ``git init``) then one short process, ``sh -c 'sleep 60 & echo ready'``, which exits at once and leaves
a background child running in the sandbox (as an agent's ``cmd &`` would), then ``close()``. Timed per
session: create, spawn-to-exit of the short process (under ``isolation="none"`` it runs behind
`procs.die_with_us`'s watchdog; under ``"bwrap"`` in new pid/ipc/uts namespaces), start = the two together,
and close. The two modes alternate session by session, so a noisy machine slows both alike.

After the last session: processes left (every /proc entry whose environment carries ``WORKBENCH_SANDBOX=`` with
one of this run's sandbox ids, zombies excluded) and folders left (``wb-sbx-*`` in the run's own temp dir).
Both must be 0. Prints a table and writes a new benchmarks/results/sandbox_lifecycle/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file), or --out
(refused if it exists).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file
from workbench.sandbox import Sandbox, MARKER_ENV, bwrap_available

COMMAND = ["sh", "-c", "sleep 60 & echo ready"]


def marked_processes(ids: set[str]) -> list[int]:
    """Live processes whose environment marks them as belonging to one of `ids`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if state in (b"Z", b"X"):
            continue
        for entry in env:
            if entry.startswith(f"{MARKER_ENV}=".encode()) and entry.split(b"=", 1)[1].decode() in ids:
                found.append(int(pid))
                break
    return found


def one_session(isolation: str, base: Path) -> tuple[str, dict[str, float]]:
    t0 = time.perf_counter()
    sb = Sandbox.create({"README.md": "task\n"}, isolation=isolation, base_dir=base)
    t1 = time.perf_counter()
    try:
        proc = sb.spawn(COMMAND, stdout=sb.root / "tmp" / "out.txt")
        code = proc.wait(60)
        t2 = time.perf_counter()
        if code != 0 or (sb.root / "tmp" / "out.txt").read_text().strip() != "ready":
            raise RuntimeError(f"{isolation}: the short process failed (exit {code})")
    finally:
        t2b = time.perf_counter()
        sb.close()
        t3 = time.perf_counter()
    return sb.id, {
        "create_ms": 1000 * (t1 - t0),
        "run_ms": 1000 * (t2 - t1),
        "start_ms": 1000 * (t2 - t0),
        "close_ms": 1000 * (t3 - t2b),
    }


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _cpu_model() -> str:
    """The host's CPU model (the machine varies between sessions: an AMX Xeon or an AVX2 EPYC)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100, help="sessions per isolation mode")
    parser.add_argument("--isolation", nargs="+", default=["none", "bwrap"], choices=["none", "bwrap"])
    parser.add_argument("--out", type=Path, default=None, help="the JSON record, refused if it exists (default: new)")
    args = parser.parse_args()
    try:
        out = new_run_file("sandbox_lifecycle", args.out)
    except FileExistsError:
        parser.error(f"--out {args.out} exists: each run writes its own file")
    modes = [m for m in args.isolation if m != "bwrap" or bwrap_available()]
    started = dt.datetime.now(dt.timezone.utc)
    base = Path(tempfile.mkdtemp(prefix="wb-bench-sandbox-"))
    base.chmod(0o755)  # plain mode: the sandbox uids walk to their folders on their own rights
    timings: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    ids: dict[str, set[str]] = {m: set() for m in modes}
    try:
        for mode in modes:  # warm-up: page cache, the first bwrap/python start
            one_session(mode, base)
        for i in range(args.sessions):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                sid, t = one_session(mode, base)
                ids[mode].add(sid)
                timings[mode].append(t)
        time.sleep(1.0)  # let the kernel reap what was killed last
        left = {
            m: {
                "processes": marked_processes(ids[m]),
                "folders": sorted(p.name for p in base.iterdir() if p.name.startswith("wb-sbx-")),
            }
            for m in modes
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)

    summary: dict[str, Any] = {}
    for mode in modes:
        summary[mode] = {
            key: {"p50": _pct([t[key] for t in timings[mode]], 0.5), "p99": _pct([t[key] for t in timings[mode]], 0.99)}
            for key in ("create_ms", "run_ms", "start_ms", "close_ms")
        }
        summary[mode]["processes_left"] = len(left[mode]["processes"])
        summary[mode]["folders_left"] = len(left[mode]["folders"])
    if "none" in summary and "bwrap" in summary:
        summary["bwrap_vs_none"] = {
            q: summary["bwrap"]["start_ms"][q] / summary["none"]["start_ms"][q] for q in ("p50", "p99")
        }

    print(
        f"{'isolation':<9} {'sessions':>8} {'create p50/p99 ms':>18} {'run p50/p99 ms':>16} "
        f"{'start p50/p99 ms':>17} {'close p50/p99 ms':>17} {'procs left':>10} {'dirs left':>9}"
    )
    for mode in modes:
        s = summary[mode]
        cells = {k: f"{s[k]['p50']:.1f} / {s[k]['p99']:.1f}" for k in ("create_ms", "run_ms", "start_ms", "close_ms")}
        print(
            f"{mode:<9} {len(timings[mode]):>8} {cells['create_ms']:>18} {cells['run_ms']:>16} "
            f"{cells['start_ms']:>17} {cells['close_ms']:>17} {s['processes_left']:>10} {s['folders_left']:>9}"
        )
    if "bwrap_vs_none" in summary:
        r = summary["bwrap_vs_none"]
        print(f"start latency, bwrap / none: {r['p50']:.2f}x at p50, {r['p99']:.2f}x at p99")
    record = {
        "benchmark": "sandbox_lifecycle",
        "date": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "benchmarks/sandbox_lifecycle.py", *sys.argv[1:]]),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "load_avg_1m": os.getloadavg()[0],
            "bwrap": shutil.which("bwrap") is not None,
        },
        "host": host(),
        "sessions": args.sessions,
        "command_in_sandbox": COMMAND,
        "summary": summary,
        "left": left,
        "timings": timings,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    sys.exit(0 if all(summary[m]["processes_left"] == 0 == summary[m]["folders_left"] for m in modes) else 1)


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
