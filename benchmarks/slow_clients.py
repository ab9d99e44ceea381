"""Slow clients against the capture proxy in a process with few file descriptors: the denial, with and without
the guard (`workbench.capture.guard`).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/slow_clients.py     # 1.5-3 min on the 2-core machine, mostly 2 start-ups
    .venv/bin/python benchmarks/slow_clients.py --connections 400 --open-files 320 --seconds 20

The proxy (`CaptureProxy` in front of the scripted upstream, `tests/scripted_upstream.py`) runs in a child process
allowed ``--open-files`` descriptors (RLIMIT_NOFILE: a stand-in for any limit, which enough slow clients reach).
This process opens ``--connections`` connections that each send one byte of a request head every 2 s, and every
second times ``GET /health`` (2 s timeout); 5 s in, it opens a session and makes one model call (in a thread, so
that a proxy answering nothing stalls only that). It counts the slow connections still open and the proxy's open
descriptors each second. Twice: every rule off (the proxy as it was), then `ConnectionLimits()` (the defaults).
Prints a summary per run and writes a new benchmarks/results/slow_clients/<date>_<host>.json per run
(benchmarks/run_file.py; ``--out`` names another).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import threading
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # scripted_upstream
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file
from scripted_upstream import ScriptedUpstream

import httpx

from workbench.capture import CaptureProxy, ConnectionLimits, ProxyClient

SLOW_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: "  # never finished
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def serve(upstream: str, limits: ConnectionLimits, open_files: int, pipe: Connection) -> None:
    """The child: the proxy under an RLIMIT_NOFILE of `open_files`, until the parent says stop."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with CaptureProxy(upstream, "scripted", connection_limits=limits) as proxy:
        pipe.send((proxy.url, proxy.admin_key, os.getpid()))
        pipe.recv()


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def model_call(url: str, admin_key: str, out: dict[str, Any]) -> None:
    """A session opened and one model call through it; `out` gets the status, whether it was recorded, seconds."""
    t = time.monotonic()
    try:
        client = ProxyClient(url, admin_key)
        key = client.open_session(harness="opencode", temperature=1.0)
        r = httpx.post(f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        out.update(status=r.status_code, recorded=len(client.trace(key)))
    except Exception as exc:  # noqa: BLE001 - what the client saw is the result
        out.update(status=type(exc).__name__)
    out["took_s"] = round(time.monotonic() - t, 2)


def attack(url: str, admin_key: str, pid: int, connections: int, seconds: float) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    slow: list[socket.socket] = []
    t0 = time.monotonic()
    for _ in range(connections):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(SLOW_HEAD)
        s.setblocking(False)
        slow.append(s)
    closed_at: dict[int, float] = {}
    ticks: list[dict[str, Any]] = []
    call: dict[str, Any] = {"status": "not answered within the run"}
    caller: threading.Thread | None = None
    while (now := time.monotonic() - t0) < seconds:
        for i, s in enumerate(slow):
            if i in closed_at:
                continue
            try:
                if _closed(s):
                    closed_at[i] = now
                elif int(now) % 2 == 0:
                    s.send(b"a")
            except OSError:
                closed_at[i] = now
        t = time.monotonic()
        try:
            status: int | str = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        ticks.append(
            {"t_s": round(now, 1), "health": status, "health_s": round(time.monotonic() - t, 3), "proxy_fds": fds}
            | {"slow_open": connections - len(closed_at)}
        )
        if caller is None and now >= 5:  # in a thread: a proxy that accepts nothing must not stall the loop
            caller = threading.Thread(target=model_call, args=(url, admin_key, call), daemon=True)
            call["t_s"] = round(now, 1)
            caller.start()
        time.sleep(max(0.0, 1 - (time.monotonic() - t0 - now)))
    for s in slow:
        s.close()
    ok = [x["health_s"] for x in ticks if x["health"] == 200]
    times = sorted(closed_at.values())
    return {
        "health_ok": len(ok),
        "health_checks": len(ticks),
        "health_ok_p50_s": round(statistics.median(ok), 3) if ok else None,
        "health_ok_max_s": max(ok) if ok else None,
        "model_call": call,
        "slow_closed": len(times),
        "slow_closed_before_2s": sum(t < 2 for t in times),
        "slow_closed_last_s": round(times[-1], 1) if times else None,
        "proxy_fds_max": max(x["proxy_fds"] for x in ticks),
        "ticks": ticks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=400)
    ap.add_argument("--open-files", type=int, default=320)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=None, help="default: results/slow_clients/<date>_<host>.json")
    args = ap.parse_args()
    machine = host() | {"loadavg_at_start": os.getloadavg()}  # the 2-core machine is shared: say how busy
    out = new_run_file("slow_clients", args.out)
    up = ScriptedUpstream().start()
    runs: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    try:
        for name, limits in (("rules off", ConnectionLimits(None, None, None)), ("defaults", ConnectionLimits())):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(up.url, limits, args.open_files, child), daemon=True)
            proc.start()
            url, admin_key, pid = parent.recv()
            runs[name] = {"limits": asdict(limits)} | attack(url, admin_key, pid, args.connections, args.seconds)
            parent.send("stop")
            proc.join(30)
            if proc.is_alive():
                proc.kill()
            r = runs[name]
            print(
                f"{name:>9}: /health {r['health_ok']}/{r['health_checks']} ok (max {r['health_ok_max_s']} s), "
                f"model call {r['model_call']}, slow closed {r['slow_closed']}/{args.connections} "
                f"({r['slow_closed_before_2s']} within 2 s, last at {r['slow_closed_last_s']} s), "
                f"proxy fds max {r['proxy_fds_max']}",
                flush=True,
            )
    finally:
        up.stop()
    result = {
        "command": "benchmarks/slow_clients.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine,
        "connections": args.connections,
        "open_files": args.open_files,
        "seconds": args.seconds,
        "runs": runs,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
