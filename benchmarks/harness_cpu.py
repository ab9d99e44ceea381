"""What one opencode rollout costs the 2 cores besides the model: CPU seconds of the sandbox + harness, per setting.

    .venv/bin/python benchmarks/harness_cpu.py --n 4        # ~3 min here, no engine

In a group of 8 SmolLM2 rollouts on this 2-core machine the sandboxes and opencode processes took 70-78 of the
~200 CPU seconds the group used (benchmarks/group_start.py's `cpu_s`): time the engine could have had. Here each
rollout runs alone, serially, against the scripted upstream (tests/scripted_upstream.py: instant answers, so
only the harness's own work is left): a `write` tool call, then a text answer, plus opencode's title call when it
makes one. CPU seconds are those of every process this one started (bwrap, opencode and what it starts), read
from /proc every 0.2 s (`benchmarks/cpu_account.py`), per rollout; wall is the rollout's start to its harness's exit. Settings: `shipped` (today's launch),
`titled` (`RolloutConfig.skip_title_call`: opencode's own ``run --title``), and `titled+flags`, which adds
opencode's own switches for services a headless one-shot run does not use (file watcher, fast file finder,
embedded web UI, external plugins; each read from its 1.18.33 binary). Writes
a new benchmarks/results/harness_cpu/<date>_<host>.json per run (benchmarks/run_file.py: never an earlier run's file), or --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

FLAGS = {
    "OPENCODE_EXPERIMENTAL_DISABLE_FILEWATCHER": "1",
    "OPENCODE_DISABLE_FFF": "1",
    "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
    "OPENCODE_PURE": "1",
}
SETTINGS = {"shipped": (False, {}), "titled": (True, {}), "titled+flags": (True, FLAGS)}


def main() -> None:
    from cpu_account import CpuAccount
    from run_file import host, new_run_file
    from scripted_upstream import ScriptedUpstream

    from workbench.capture import CaptureProxy
    from workbench.harnesses import OpenCode
    from workbench.train import HarnessSessionFactory
    from workbench.rollout import RolloutConfig
    from workbench.tasks import load_task

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None, help="results JSON, refused if it exists (default: a new file)")
    args = ap.parse_args()
    try:
        out = new_run_file("harness_cpu", args.out)
    except FileExistsError:
        ap.error(f"--out {args.out} exists: each run writes its own file")
    launch = OpenCode.launch
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host(), "n": args.n, "settings": []}
    for name in args.settings.split(","):
        titled, env = SETTINGS[name]

        def launch_with_env(self, *a, _env=env, **kw):  # type: ignore[no-untyped-def]
            out = launch(self, *a, **kw)
            return replace(out, env={**out.env, **_env})

        OpenCode.launch = launch_with_env  # type: ignore[method-assign]
        cpu, wall, calls = [], [], []
        up = ScriptedUpstream().start()
        try:
            with CaptureProxy(up.url, "scripted") as proxy:
                config = RolloutConfig(max_output_tokens=16, skip_title_call=titled)
                factory = HarnessSessionFactory(proxy.client(), config)
                for i in range(args.n + 1):  # the first one warms the page cache; not counted
                    up.script = ["tool", "text"]
                    up.untooled = "text"
                    with CpuAccount(every_s=0.2) as account:
                        t = time.monotonic()
                        session = factory.create(load_task("humaneval/0"))
                        try:
                            session.wait_for_completion()
                            took = time.monotonic() - t
                            purposes = [c.get("purpose", "?") for c in session.calls()]
                        finally:
                            session.close()
                    if i:
                        cpu.append(account.report().get("sandboxes+agents", 0.0))
                        wall.append(took)
                        calls.append(purposes)
        finally:
            up.stop()
            OpenCode.launch = launch  # type: ignore[method-assign]
        row = {
            "setting": name,
            "skip_title_call": titled,
            "env": env,
            "cpu_s_median": round(statistics.median(cpu), 2),
            "cpu_s": [round(x, 2) for x in cpu],
            "wall_s_median": round(statistics.median(wall), 2),
            "calls": calls,
        }
        print(json.dumps(row), flush=True)
        results["settings"].append(row)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
