"""Verification throughput: HumanEval's 164 canonical solutions, serial vs a process pool, per sandbox.

    OMP_NUM_THREADS=1 python benchmarks/verify_throughput.py            # all 164, both sandboxes
    python benchmarks/verify_throughput.py --tasks 40 --workers 1 4     # a quicker look

Prints a table (tests/s = held-out tests graded per second; a HumanEval task has one, its check())
and writes it, with the machine's description, to a new benchmarks/results/verify_throughput/<date>_<host>.json
per run (benchmarks/run_file.py: never an earlier run's file).
Every solution must score 1.0: a run that does not is reported as failed, not timed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_file
from run_file import host, new_run_file
from workbench.tasks import humaneval_path, load_tasks
from workbench.verify import verify_many


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=164, help="first N HumanEval tasks (default: all 164)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, len(os.sched_getaffinity(0))],
        help="pool sizes to time (1 = serial, in this process)",
    )
    parser.add_argument("--sandbox", nargs="+", default=["none", "bwrap"], choices=["none", "bwrap"])
    args = parser.parse_args()
    sandboxes = [s for s in args.sandbox if s != "bwrap" or shutil.which("bwrap")]

    with gzip.open(humaneval_path(), "rt") as f:
        rows = [json.loads(line) for line in f][: args.tasks]
    tasks = load_tasks(f"humaneval[:{args.tasks}]")
    base = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    try:
        items = []
        for task, row in zip(tasks, rows, strict=True):
            ws = base / task.id.replace("/", "-")
            ws.mkdir()
            (ws / "solution.py").write_text(row["prompt"] + row["canonical_solution"])
            items.append((task, ws))
        runs = []
        for sandbox in sandboxes:
            for workers in args.workers:
                start = time.perf_counter()
                results = verify_many(items, workers=workers, progress=False, sandbox=sandbox)
                seconds = time.perf_counter() - start
                tests = sum(r.total for r in results)
                runs.append(
                    {
                        "sandbox": sandbox,
                        "workers": workers,
                        "tasks": len(items),
                        "tests": tests,
                        "seconds": round(seconds, 2),
                        "tests_per_s": round(tests / seconds, 1),
                        "all_passed": all(r.reward == 1.0 for r in results),
                        "guards": results[0].guards,
                    }
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"{'sandbox':<8} {'workers':>7} {'tests':>6} {'seconds':>8} {'tests/s':>8}  all passed  guards")
    for r in runs:
        print(
            f"{r['sandbox']:<8} {r['workers']:>7} {r['tests']:>6} {r['seconds']:>8.2f} {r['tests_per_s']:>8.1f}  "
            f"{'yes' if r['all_passed'] else 'NO':<10}  {','.join(r['guards'])}"
        )
    # The load average says how much else ran meanwhile (timings on a shared machine are noisy).
    machine = {
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
        "bwrap": _version("bwrap"),
        "platform": platform.platform(),
        "load_avg_1m": os.getloadavg()[0],
    }
    date = dt.datetime.now().isoformat(timespec="seconds")
    record = {"benchmark": "verify_throughput", "date": date, "machine": machine, "host": host(), "runs": runs}
    path = new_run_file("verify_throughput")
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"load average (1 min) at the end: {machine['load_avg_1m']:.1f} on {machine['cpus']} CPUs; wrote {path}")
    sys.exit(0 if all(r["all_passed"] for r in runs) else 1)


def _version(tool: str) -> str | None:
    if shutil.which(tool) is None:
        return None
    return subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()  # Ctrl-C / SIGTERM stop what the run started, even from nohup
    main()
