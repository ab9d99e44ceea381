"""What the syscall filter costs a sandbox: one ``true`` run in a fresh bwrap sandbox, with the filter and without,
interleaved run by run (host load falls on both alike), medians and their ratio; and the filter's own build (once
per process) and per-spawn hand-over (a memfd).

    .venv/bin/python benchmarks/seccomp_cost.py [--n 20]
"""

from __future__ import annotations

import argparse
import os
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # run_file

from run_file import host, new_run_file
from workbench.sandbox import Sandbox
from workbench.sandbox import seccomp


def one(base: Path) -> float:
    t = time.perf_counter()
    with Sandbox.create({}, isolation="bwrap", base_dir=base) as sb:
        code, out = sb.run(["true"], timeout_s=60)
    if code != 0:
        raise RuntimeError(out)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="sandboxes of each kind")
    args = ap.parse_args()
    t = time.perf_counter()
    seccomp.bpf_program()
    build_s = time.perf_counter() - t
    fds = []
    t = time.perf_counter()
    for _ in range(100):
        fds.append(seccomp.filter_fd())
    handover_s = (time.perf_counter() - t) / 100
    for fd in fds:
        os.close(fd)
    times: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(prefix="wb-seccomp-bench-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        one(base)  # warm the page cache
        for _ in range(args.n):
            times["with"].append(one(base))
            with mock.patch("workbench.sandbox.session.filter_fd", lambda: None):
                times["without"].append(one(base))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "host": host(),
        "n": args.n,
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "ratio_with_over_without": round(med["with"] / med["without"], 3),
        "added_ms_median": round(1000 * (med["with"] - med["without"]), 2),
        "filter_build_ms_once": round(1000 * build_s, 2),
        "filter_handover_us_per_spawn": round(1e6 * handover_s, 1),
        "program_bytes": len(seccomp.bpf_program()),
        "times_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
    }
    path = new_run_file("seccomp_cost")
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
