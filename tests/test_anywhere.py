"""The project works wherever it is checked out: below a 0700 folder (root's home, a `mktemp -d`), under a
path with spaces, with the sandboxes' temp folders there too.

A copy of the package and a hard-linked copy of the harness install are placed in
``<mkdtemp, 0700>/my projects/wb`` (the package's location decides `project_root`, the init script
and the harness bound into each sandbox), and the workbench is run from there in a subprocess, its
TMPDIR (sandbox and grading folders) below the same 0700 folder:

- ``sandbox-check`` (set-up's check) runs opencode --version in a bwrap sandbox; in plain mode,
  where the sandbox uid walks the host's folders on its own rights, it refuses and names the folder
  that blocks the way;
- a real opencode rollout against the scripted upstream (a test double for the engine) writes
  solution.py with its bash tool inside the sandbox, and the grading jail runs the hidden tests on it:
  reward 1.0 needs both to have worked from there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scripted_upstream import ScriptedUpstream
from workbench.paths import project_root
from workbench.sandbox import bwrap_available

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a 0700 folder only locks out a fresh uid when we are root"),
    pytest.mark.skipif(
        not (project_root() / "tools" / "node_modules" / ".bin" / "opencode").exists(),
        reason="opencode is not installed (scripts/setup.sh)",
    ),
]
BWRAP = pytest.mark.skipif(not bwrap_available(), reason="bwrap is not installed (scripts/setup.sh installs it)")
SOLUTION = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def hidden() -> Path:
    """``<0700 folder>/my projects/wb``: the package copied, the harness install hard-linked (copied
    when the file system refuses links), a temp folder beside it. Removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="wb-0700-"))
    assert top.stat().st_mode & 0o777 == 0o700
    checkout = top / "my projects" / "wb"
    try:
        src = project_root()
        shutil.copytree(src / "workbench", checkout / "workbench", ignore=shutil.ignore_patterns("__pycache__"))
        (checkout / "tools").mkdir()
        for name in ("package.json", "package-lock.json"):
            shutil.copy2(src / "tools" / name, checkout / "tools" / name)
        modules = checkout / "tools" / "node_modules"
        if subprocess.run(["cp", "-al", str(src / "tools" / "node_modules"), str(modules)]).returncode != 0:
            shutil.rmtree(modules, ignore_errors=True)
            shutil.copytree(src / "tools" / "node_modules", modules, symlinks=True)
        (top / "tmp").mkdir(mode=0o700)
        yield checkout
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


def _workbench(checkout: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`python -m workbench ARGS` with the package imported from `checkout`, its temp folders there."""
    return _python(checkout, "-m", "workbench", *args, timeout=timeout)


def _python(checkout: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "TMPDIR": str(checkout.parent.parent / "tmp"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_copy_really_is_out_of_the_sandbox_uids_reach(hidden):
    """Guard against a test that passes by accident: the copy is what runs, and a fresh uid cannot
    walk to it on its own rights."""
    probe = _workbench(hidden, "--help")
    assert probe.returncode == 0, probe.stderr
    where = _python(hidden, "-c", "import workbench.paths as p; print(p.project_root())")
    assert where.stdout.strip() == str(hidden), where.stdout + where.stderr
    walk = subprocess.run(
        [
            "setpriv",
            "--reuid=1999999",
            "--regid=1999999",
            "--clear-groups",
            "--",
            "/usr/bin/test",
            "-x",
            str(hidden / "tools" / "node_modules" / ".bin" / "opencode"),
        ]
    )
    assert walk.returncode != 0


@BWRAP
def test_sandbox_check_runs_the_harness_from_a_0700_folder(hidden):
    done = _workbench(hidden, "sandbox-check", "--isolation", "bwrap")
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "ran in a bwrap sandbox as a fresh uid" in line and f"(mounting {hidden / 'tools'})" in line
    assert line.split()[1][0].isdigit(), line  # "opencode 1.x.y ran in ..."


def test_plain_mode_names_the_folder_that_blocks_the_way(hidden):
    done = _workbench(hidden, "sandbox-check", "--isolation", "none")
    assert done.returncode == 1
    line = done.stdout.strip().splitlines()[-1]
    assert f"cannot enter {hidden.parent.parent} " in line, line
    assert "use bwrap" in line


@BWRAP
def test_a_real_rollout_and_its_grading_from_a_0700_folder(hidden):
    """opencode (real binary) in bwrap runs a bash tool call the scripted engine asks for, which writes
    the right solution; the hidden tests pass in the grading jail: reward 1.0."""
    up = ScriptedUpstream().start()
    up.untooled = "text"
    up.script = [f"bash:printf '{SOLUTION.replace(chr(10), chr(92) + 'n')}' > solution.py", "text"]
    out = hidden.parent.parent / "tmp" / "rollout out"
    try:
        done = _workbench(
            hidden,
            "rollout",
            "--task",
            "easy/0",
            "--upstream",
            up.url,
            "--served-name",
            "scripted",
            "--isolation",
            "bwrap",
            "--max-calls",
            "4",
            "--timeout",
            "180",
            "--out",
            str(out),
        )
    finally:
        up.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok", summary
    assert (out / "workspace" / "solution.py").read_text() == SOLUTION
    assert summary["reward"] == 1.0, summary
    assert any(r.get("messages") for r in up.requests[1:])  # the bash result went back to the engine
