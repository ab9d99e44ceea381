"""What the sandbox's one way out costs: a call from inside a sandbox to its endpoint, direct vs relayed.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sandbox_relay.py            # ~30 s
    .venv/bin/python benchmarks/sandbox_relay.py --calls 500 --size 65536

Under bubblewrap the agent has a network namespace of its own: its connections to the capture proxy go
to `_sandbox_init`'s listener inside, over a Unix socket, through `workbench.sandbox.net`'s relay to the
host's TCP port. In plain mode they go straight to the port. A host HTTP server answers each GET with
`--size` bytes (about one streamed chunk, or one whole non-streamed answer); a client inside the
sandbox makes `--calls` sequential requests on one keep-alive connection and times each. The two
modes alternate in rounds, so a noisy machine slows both alike. Prints a table and writes
a new benchmarks/results/sandbox_relay/<date>_<host>.json per run (benchmarks/run_file.py; p50/p99 per mode, and
bwrap minus none).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file
from run_file import host, new_run_file
from workbench.sandbox import Sandbox, bwrap_available

CLIENT = """
import http.client, json, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = http.client.HTTPConnection(host, port, timeout=10)
out = []
for _ in range(n):
    t = time.perf_counter()
    conn.request("GET", "/")
    conn.getresponse().read()
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""


def serve(size: int) -> http.server.ThreadingHTTPServer:
    payload = b"x" * size

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as uvicorn does: else every answer waits ~40 ms for a delayed ACK

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def one_round(mode: str, url: str, calls: int, base: Path) -> list[float]:
    with Sandbox.create({"client.py": CLIENT}, isolation=mode, base_dir=base, endpoint=url, git_init=False) as sb:
        inside = sb.reach(url).removeprefix("http://")
        host, port = inside.split(":")
        code, out = sb.run(["python", "client.py", host, port, str(calls)], timeout_s=120)
    if code != 0:
        raise RuntimeError(f"{mode}: client failed: {out[-500:]}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--size", type=int, default=2048, help="bytes per answer")
    args = ap.parse_args()
    if not bwrap_available():
        raise SystemExit("bwrap is not installed: run scripts/setup.sh")
    server = serve(args.size)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    base = Path(tempfile.mkdtemp(prefix="wb-relay-bench-"))
    base.chmod(0o755)
    load = [os.getloadavg()[0]]
    samples: dict[str, list[float]] = {"none": [], "bwrap": []}
    for _ in range(args.rounds):
        for mode in samples:
            samples[mode] += one_round(mode, url, args.calls, base)[5:]  # the first calls open the connection
    load.append(os.getloadavg()[0])
    server.shutdown()
    base.rmdir()

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)

    rows = {
        m: {"calls": len(xs), "p50_ms": round(statistics.median(xs), 3), "p99_ms": pct(xs, 0.99)}
        for m, xs in samples.items()
    }
    result = {
        "benchmark": "sandbox_relay",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_before_after": load},
        "host": host(),
        "settings": vars(args),
        "modes": rows,
        "relay_adds_ms": {
            "p50": round(rows["bwrap"]["p50_ms"] - rows["none"]["p50_ms"], 3),
            "p99": round(rows["bwrap"]["p99_ms"] - rows["none"]["p99_ms"], 3),
        },
    }
    path = new_run_file("sandbox_relay")
    path.write_text(json.dumps(result, indent=1))
    print(f"{'mode':<6} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for m, r in rows.items():
        print(f"{m:<6} {r['calls']:>6} {r['p50_ms']:>8} {r['p99_ms']:>8}")
    print(
        f"relay adds {result['relay_adds_ms']['p50']} ms p50, {result['relay_adds_ms']['p99']} ms p99 per call "
        f"(load {load[0]:.1f} -> {load[1]:.1f}); {path}"
    )


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
