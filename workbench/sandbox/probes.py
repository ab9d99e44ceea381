"""What a process inside a sandbox can see and do, asked from inside: for notebook 01, set-up and the tests.

`check_harness` is set-up's last check: one real sandbox, made from the checkout as it is (wherever it
lives), runs the harness's ``--version`` inside; it returns one line that says what ran or, when it
did not, why and what to do.

    ok, line = check_harness(harness_bin("opencode"), ro_paths=[tools_dir()])

Each probe is a shell command run in the sandbox as the agent would run it (its uid, its limits, its
namespaces), and what it printed. Nothing a probe does outlives it: the write probe uses a fresh name
and whatever it managed to create on the host is removed (and said so).

    rows = run_probes(sb, project=project_root(), engine_url=engine.url)
    nb.show(render_table(rows))

`start_latency` times what a rollout waits for before its harness starts: a sandbox made and removed, `samples` times.

    start_latency(task.files, isolation="auto", limits=SandboxLimits(), samples=20)   # {"p50_ms": ..., "p99_ms": ...}
"""

from __future__ import annotations

import os
import secrets
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

from workbench.sandbox.session import Sandbox
from workbench.sandbox.spec import Isolation, SandboxError, SandboxLimits

__all__ = ["run_probes", "check_harness", "start_latency"]


def check_harness(binary: Path, *, ro_paths: list[Path], isolation: Isolation = "auto") -> tuple[bool, str]:
    """Start one sandbox with `ro_paths` mounted and run ``binary --version`` in it. Returns (ok, one
    line): the version and the mode, or the first line of what went wrong and what to do about it."""
    where = f"(mounting {', '.join(map(str, ro_paths))})"
    try:
        with Sandbox.create({}, isolation=isolation, limits=SandboxLimits(wall_s=120), ro_paths=ro_paths) as sb:
            code, out = sb.run([str(binary), "--version"], timeout_s=120)
            mode, uid = sb.isolation, "a fresh uid" if sb.uid is not None else f"uid {os.getuid()}"
    except (SandboxError, TimeoutError, OSError) as exc:
        return False, f"{binary.name} could not start in a sandbox {where}: {exc}"
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0:
        why = last or f"exit code {code}"
        return False, (
            f"{binary.name} --version failed in a {mode} sandbox {where}: {why[:300]}. The sandbox uid "
            "may not reach a folder (names above); rerun scripts/setup.sh, and report the line if it stays"
        )
    return True, f"{binary.name} {last} ran in a {mode} sandbox as {uid} {where}"


def run_probes(sb: Sandbox, *, project: Path, engine_url: str | None = None) -> list[dict[str, str | int]]:
    """Run the probes in `sb`; one row each: probe, command, exit code, output."""
    scratch = Path("/usr") / f"wb-probe-{secrets.token_hex(6)}"
    probes = {
        "runs as (uid, capabilities)": "echo uid=$(id -u) $(grep CapEff /proc/self/status)",
        "project folder visible": f"test -e {project} && echo yes || echo no",
        "engine/OpenAI variables in env": "env | grep -ciE 'openai|vllm' || true",
        "processes visible": "ps ax --no-headers | wc -l",
        "write outside the workspace": f"touch {scratch} 2>/dev/null && echo WROTE || echo refused",
        "address-space limit (ulimit -v, KiB)": "ulimit -v",
        "process limit (ulimit -u)": "ulimit -u",
        "python in the sandbox": "python --version",
    }
    if engine_url:
        probes["engine reachable (no key)"] = (
            "python - <<'EOF'\nimport urllib.request, urllib.error\n"
            f"try:\n    urllib.request.urlopen('{engine_url}/v1/models', timeout=3); print('answered 200')\n"
            "except urllib.error.HTTPError as e:\n    print(f'answered {e.code}')\n"
            "except OSError as e:\n    print(f'unreachable ({type(e).__name__})')\nEOF"
        )
    rows: list[dict[str, str | int]] = []
    try:
        for what, cmd in probes.items():
            code, out = sb.run(["bash", "-c", cmd], timeout_s=30)
            rows.append({"probe": what, "command": cmd.splitlines()[0], "exit": code, "output": out.strip()[:120]})
    finally:
        if scratch.exists():  # only in a mode that let it through: never leave it on the host
            scratch.unlink()
            for row in rows:
                if row["probe"] == "write outside the workspace":
                    row["output"] = f"{row['output']} (removed {scratch} from the host)"
    return rows


def start_latency(
    files: Mapping[str, str], *, isolation: Isolation, limits: SandboxLimits, samples: int
) -> dict[str, float | int | str] | None:
    """Make and close a sandbox holding `files` `samples` times; the start's p50 and p99 in ms, the count and the
    isolation it got (None when `samples` is 0: nothing measured)."""
    times, got = [], ""
    for _ in range(samples):
        t = time.perf_counter()
        with Sandbox.create(dict(files), isolation=isolation, limits=limits) as sb:
            times.append((time.perf_counter() - t) * 1000)
            got = sb.isolation
    if not times:
        return None
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    return {"p50_ms": statistics.median(times), "p99_ms": p99, "samples": len(times), "isolation": got}
