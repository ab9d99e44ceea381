"""Set-up is driven by the project's files, idempotent, and the harness binary runs offline."""

from __future__ import annotations

import subprocess

from workbench.paths import harness_bin, project_root


def test_opencode_runs_offline_from_project_install():
    out = subprocess.run(
        [str(harness_bin("opencode")), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "1.18.33"
    assert str(harness_bin("opencode")).startswith(str(project_root() / "tools"))


def test_second_setup_run_changes_nothing():
    root = project_root()
    stamps = sorted((root / ".cache" / "stamps").iterdir())
    before = {p.name: p.read_text() for p in stamps}
    out = subprocess.run([str(root / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("up to date") == 3, out.stdout
    assert {p.name: p.read_text() for p in sorted((root / ".cache" / "stamps").iterdir())} == before
