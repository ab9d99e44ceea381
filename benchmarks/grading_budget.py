"""The grading copy's write budget: what a flooding solution still gets past it, and what polling costs.

    OMP_NUM_THREADS=1 python benchmarks/grading_budget.py              # 8 floods and 3 timing rounds per sandbox
    python benchmarks/grading_budget.py --floods 3 --rounds 1 --tasks 40   # a quicker look
    python benchmarks/grading_budget.py --hogs 2 --rounds 0                # floods only, 2 busy loops beside

Flood: a function_call solution passes its first test, then writes 2 GiB in 16 MiB files (RLIMIT_FSIZE
16 MiB, ``Limits.disk_mb`` 64) into its grading copy; a thread samples the allocated size of the temp dir
every 5 ms. Reported: the peak growth with the budget polled, and once with it switched off (the old
grader: no measure, a 0.1 s select). Cost: HumanEval's first N canonical solutions verified serially,
budget on and off alternating, the median of the rounds: wall seconds, and the grader's own CPU seconds
(where the polling runs; the test processes' time is the same either way, and on a shared machine the
CPU time is the steadier figure). The ratios on/off are the per-grading cost. ``--hogs N`` keeps N busy
loops (at this process's niceness) running meanwhile: the grader and the writer wait for the CPU.
Writes a new benchmarks/results/grading_budget/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier
run's file; the first run's is benchmarks/results/grading_budget.json).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_file
from run_file import host, new_run_file
from workbench.tasks import Limits, Task, humaneval_path, load_tasks
from workbench.verify import child, jail, verify

BUDGET_MB, FILE_MB = 64, 16
FLOOD = Task(
    id="t/add",
    instruction="",
    files={},
    visible_tests="",
    test_kind="function_call",
    entry_point="add",
    held_out_tests=[{"input": [1, 2], "output": [3]}, {"input": [2, 2], "output": [4]}],
    limits=Limits(time_s=30.0, deadline_s=90.0, file_mb=FILE_MB, workspace_mb=16, disk_mb=BUDGET_MB),
)
SOLUTION = (
    "def add(a, b):\n    if a == 2:\n        chunk = bytes(1 << 20)\n"
    f"        for i in range({2048 // FILE_MB}):\n            with open(f'fill_{{i}}', 'wb') as f:\n"
    f"                for _ in range({FILE_MB}):\n                    f.write(chunk)\n    return a + b\n"
)


def allocated(root: Path) -> int:
    total = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


def budget(on: bool) -> None:
    """The budget polled (this tree), or switched off as before it existed."""
    jail.Jail.over_budget = ORIGINAL if on else (lambda self, now=True: None)  # type: ignore[method-assign]
    child.BUDGET_POLL_S = jail.BUDGET_POLL_S if on else 0.1  # the old select timeout


def flood(base: Path, sandbox: str) -> dict:
    ws = Path(tempfile.mkdtemp(dir=base))
    (ws / "solution.py").write_text(SOLUTION)
    before, peak, done = allocated(base), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], allocated(base))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = verify(FLOOD, ws, sandbox=sandbox)
    finally:
        done.set()
        sampler.join()
    shutil.rmtree(ws)
    return {"grew_mib": round((peak[0] - before) / 2**20), "reward": result.reward, "reason": result.tests[-1].reason}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floods", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=164, help="first N HumanEval tasks")
    parser.add_argument("--sandbox", nargs="+", default=["none", "bwrap"], choices=["none", "bwrap"])
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside the grader")
    args = parser.parse_args()
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.hogs)]
    base = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    base.chmod(0o755)  # the test uid passes through to the jail folders
    tempfile.tempdir = str(base)
    with gzip.open(humaneval_path(), "rt") as f:
        rows = [json.loads(line) for line in f][: args.tasks]
    record: dict = {
        "benchmark": "grading_budget",
        "poll_s": jail.BUDGET_POLL_S,
        "budget_mb": BUDGET_MB,
        "hogs": args.hogs,
        "runs": [],
    }
    try:
        items = []
        for task, row in zip(load_tasks(f"humaneval[:{args.tasks}]"), rows, strict=True):
            ws = base / task.id.replace("/", "-")
            ws.mkdir()
            (ws / "solution.py").write_text(row["prompt"] + row["canonical_solution"])
            items.append((task, ws))
        for sandbox in args.sandbox:
            budget(False)
            off = flood(base, sandbox)
            budget(True)
            floods = [flood(base, sandbox) for _ in range(args.floods)]
            seconds: dict[str, list[float]] = {"on": [], "off": []}
            cpu: dict[str, list[float]] = {"on": [], "off": []}
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    budget(mode == "on")
                    start, cpu0 = time.perf_counter(), time.process_time()
                    rewards = [verify(task, ws, sandbox=sandbox).reward for task, ws in items]
                    seconds[mode].append(time.perf_counter() - start)
                    cpu[mode].append(time.process_time() - cpu0)
                    assert all(r == 1.0 for r in rewards), f"{sandbox} {mode}: a canonical solution failed"
            run: dict = {
                "sandbox": sandbox,
                "flood_off": off,
                "flood_grew_mib": sorted(f["grew_mib"] for f in floods),
                "flood_rewards": sorted({f["reward"] for f in floods}),
                "flood_reason": floods[0]["reason"],
            }
            if args.rounds:
                on, off_s = statistics.median(seconds["on"]), statistics.median(seconds["off"])
                run |= {
                    "tasks": len(items),
                    "seconds_on": [round(s, 2) for s in seconds["on"]],
                    "seconds_off": [round(s, 2) for s in seconds["off"]],
                    "ratio_on_off": round(on / off_s, 3),
                    "grader_cpu_on": [round(s, 2) for s in cpu["on"]],
                    "grader_cpu_off": [round(s, 2) for s in cpu["off"]],
                    "cpu_ratio_on_off": round(statistics.median(cpu["on"]) / statistics.median(cpu["off"]), 3),
                }
            record["runs"].append(run)
            print(json.dumps(run))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        budget(True)
        shutil.rmtree(base, ignore_errors=True)
    record["load_avg_1m"] = os.getloadavg()[0]
    record["host"] = host()
    path = new_run_file("grading_budget")
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path} (load average {record['load_avg_1m']:.1f} on {len(os.sched_getaffinity(0))} CPUs)")


ORIGINAL = jail.Jail.over_budget

if __name__ == "__main__":
    from workbench.procs import unwind_on_signals

    unwind_on_signals()
    main()
