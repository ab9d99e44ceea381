"""What checking each connection's owner costs: a fresh connection from inside a bwrap sandbox to its endpoint,
this checkout vs an earlier revision (before the check).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sandbox_guard.py --before 72edde9      # ~1 min

Under bubblewrap `_sandbox_init` forwards a connection only when its socket is among the harness's open files
(``/proc/net/tcp``, then ``/proc/PID/fd``) and the relay checks the forwarder's pid (``SO_PEERCRED``, then
``/proc/PID/stat``). Both run once per connection, not per byte, so the cost is per connection: a client inside
the sandbox opens `--calls` connections one after another (connect, one request, the answer, close: a model
call that does not reuse its connection) and times each, holding `--fds` open files as the harness would (the
check reads every one of them; opencode held 31 in a rollout). The host answers each with 2 bytes. Rounds of
the two trees alternate (`--before REV` is extracted with ``git archive`` into a temp folder and imported from
there), so a noisy machine slows both alike. Wall-clock latency on a loaded machine is mostly waiting to be
scheduled, so the CPU time spent per connection is measured too: the forwarder's (the client's parent, from its
/proc/PID/stat) and the host process's (the relay's loop; `time.process_time`). Prints a table; writes
``results/sandbox_guard/<date>_<host>.json`` (`run_file`): per tree p50/p99/mean latency and CPU per connection,
the first connection of each round (the harness is found and pinned) apart, and after / before.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` in clock ticks (/proc/PID/stat fields 14 and 15; readable for a non-dumpable one)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def client(port: int, calls: int, fds: int) -> None:
    """Inside the sandbox (standard library only): `calls` fresh connections, each timed, and the CPU time the
    forwarder (our parent) spent meanwhile, as JSON on stdout."""
    held = [open(os.devnull) for _ in range(max(0, fds - len(os.listdir("/proc/self/fd"))))]
    out = []
    cpu = _cpu_ticks(os.getppid())
    for _ in range(calls):
        t = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            if s.recv(16) != b"ok":
                raise SystemExit("refused")
        out.append((time.perf_counter() - t) * 1e6)
    ticks = _cpu_ticks(os.getppid()) - cpu
    print(json.dumps({"us": out, "forwarder_cpu_us": ticks * 1e6 / os.sysconf("SC_CLK_TCK")}))
    for f in held:
        f.close()


def serve() -> socket.socket:
    server = socket.create_server(("127.0.0.1", 0), backlog=128)

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.recv(4096)
                conn.sendall(b"ok")

    threading.Thread(target=loop, daemon=True).start()
    return server


def one_round(tree: Path, port: int, calls: int, fds: int) -> dict:
    """One sandbox, in a subprocess importing workbench from `tree`: the client's timings, the forwarder's and the
    host process's (the relay's) CPU time."""
    cmd = [
        sys.executable,
        __file__,
        "--round",
        str(tree),
        "--port",
        str(port),
        "--calls",
        str(calls),
        "--fds",
        str(fds),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stdout[-500:]} {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def round_in(tree: Path, port: int, calls: int, fds: int) -> None:
    sys.path.insert(0, str(tree))
    from workbench.sandbox import Sandbox

    assert Path(sys.modules["workbench"].__file__ or "").is_relative_to(tree), "imported the wrong tree"
    base = Path(tempfile.mkdtemp(prefix="wb-guard-bench-"))
    base.chmod(0o755)
    url = f"http://127.0.0.1:{port}"
    try:
        files = {"client.py": Path(__file__).read_text()}
        with Sandbox.create(files, isolation="bwrap", base_dir=base, endpoint=url, git_init=False) as sb:
            inside = int(sb.reach(url).rsplit(":", 1)[1])
            cpu = time.process_time()  # this process: the relay's loop, and the wait polling alike in both trees
            code, text = sb.run(
                ["python", "client.py", "--client", str(inside), "--calls", str(calls), "--fds", str(fds)],
                timeout_s=240,
            )
            cpu = time.process_time() - cpu
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if code != 0:
        raise SystemExit(text[-1000:])
    print(json.dumps({**json.loads(text.strip().splitlines()[-1]), "host_cpu_us": cpu * 1e6}))


def stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "n": len(s),
        "p50_us": round(statistics.median(s), 1),
        "p99_us": round(s[min(len(s) - 1, int(0.99 * len(s)))], 1),
        "mean_us": round(statistics.fmean(s), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--before", help="the git revision to compare with (before the check)")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4, help="rounds per tree, alternating")
    ap.add_argument("--fds", type=int, default=31, help="open files the client holds (opencode: 31)")
    ap.add_argument("--out", type=Path, help="results file (default results/sandbox_guard/<date>_<host>.json)")
    ap.add_argument("--round", type=Path, help=argparse.SUPPRESS)  # internal: one round, importing this tree
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)  # internal: the client, inside the sandbox
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client is not None:
        return client(args.client, args.calls, args.fds)
    if args.round is not None:
        return round_in(args.round, args.port, args.calls, args.fds)
    if not args.before:
        ap.error("--before REV is required")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_file import host, new_run_file

    rev = subprocess.run(["git", "rev-parse", args.before], cwd=ROOT, capture_output=True, text=True, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    old = Path(tempfile.mkdtemp(prefix="wb-guard-before-"))
    server = serve()
    port = server.getsockname()[1]
    load = [os.getloadavg()[0]]
    samples: dict[str, list[float]] = {"before": [], "after": []}
    first: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, dict[str, float]] = {n: {"forwarder_cpu_us": 0.0, "host_cpu_us": 0.0} for n in samples}
    try:
        archive = subprocess.run(["git", "archive", rev.stdout.strip(), "workbench"], cwd=ROOT, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        old.chmod(0o755)
        for _ in range(args.rounds):
            for name, tree in (("before", old), ("after", ROOT)):
                got = one_round(tree, port, args.calls, args.fds)
                first[name].append(round(got["us"][0], 1))
                samples[name] += got["us"][1:]
                for k in cpu[name]:
                    cpu[name][k] += got[k]
    finally:
        server.close()
        shutil.rmtree(old, ignore_errors=True)
    load.append(os.getloadavg()[0])
    rows = {name: stats(xs) for name, xs in samples.items()}
    for name, r in rows.items():  # CPU per connection, over every connection of every round
        n = args.rounds * args.calls
        r.update({k.replace("_us", "_us_per_conn"): round(v / n, 1) for k, v in cpu[name].items()})
    keys = ("p50_us", "p99_us", "mean_us", "forwarder_cpu_us_per_conn", "host_cpu_us_per_conn")
    ratio = {k: round(rows["after"][k] / rows["before"][k], 3) for k in keys}
    path = new_run_file("sandbox_guard", args.out)
    result = {
        "benchmark": "sandbox_guard",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {**host(), "loadavg_before_after": load},
        "command": " ".join(["benchmarks/sandbox_guard.py", *sys.argv[1:]]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("round", "client", "port", "out")},
        "trees": {"before": rev.stdout.strip(), "after": f"{head.stdout.strip()} (the working tree)"},
        "per_connection": rows,
        "first_connection_us": first,
        "after_over_before": ratio,
        "added_us": {k: round(rows["after"][k] - rows["before"][k], 1) for k in keys},
    }
    path.write_text(json.dumps(result, indent=1))
    print(
        f"{'tree':<7} {'conns':>6} {'p50 us':>8} {'p99 us':>8} {'mean us':>8} {'fwd cpu':>8} {'host cpu':>8} first (us)"
    )
    for name, r in rows.items():
        print(
            f"{name:<7} {r['n']:>6} {r['p50_us']:>8} {r['p99_us']:>8} {r['mean_us']:>8} "
            f"{r['forwarder_cpu_us_per_conn']:>8} {r['host_cpu_us_per_conn']:>8} {first[name]}"
        )
    print(f"after/before: {ratio} (load {load[0]:.1f} -> {load[1]:.1f}); {path}")


if __name__ == "__main__":
    if "--client" not in sys.argv and "--round" not in sys.argv:  # a round imports its own tree; a client has none
        sys.path.insert(0, str(ROOT))
        from workbench.procs import unwind_on_signals

        unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
