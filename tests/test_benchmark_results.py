"""Benchmark results: one file per run, never overwritten, and every results file the docs cite is there.

`benchmarks/run_file.py` names each run's file by date and host and refuses an existing one; no script under
benchmarks/ writes a fixed results file name (one used to merge every run into ``cpu_loop.json``, mixing two hosts
under one header); each ``results/cpu_loop/`` file holds one run from one host; and every ``results/...`` path that
README.md, docs/, benchmarks/README.md or a notebook cites exists. No benchmark runs here (they take minutes).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_file  # noqa: E402


def test_each_run_gets_its_own_file_named_by_date_and_host(tmp_path, monkeypatch):
    monkeypatch.setattr(run_file, "RESULTS", tmp_path)
    now = dt.datetime(2026, 12, 2, 8, 30, 0)
    first = run_file.new_run_file("cpu_loop", now=now)
    first.write_text('{"run": 1}')
    second = run_file.new_run_file("cpu_loop", now=now)  # same second, same host: still a new file
    assert first.parent == second.parent == tmp_path / "cpu_loop"
    assert first.name == f"2026-12-02T083000_{run_file.host_slug()}.json"
    assert second.name == f"2026-12-02T083000_{run_file.host_slug()}_2.json"
    assert first.read_text() == '{"run": 1}'  # the first run's file is untouched
    with pytest.raises(FileExistsError):
        run_file.new_run_file("cpu_loop", first)  # an explicit --out that exists is refused, not merged into
    assert first.read_text() == '{"run": 1}'
    slug = run_file.host_slug()
    assert re.fullmatch(r"[a-z0-9-]+", slug) and run_file.host()["host"] == slug


def test_no_benchmark_script_writes_a_fixed_results_file():
    fixed = re.compile(r"""["']results["']\s*/\s*["'][\w.-]+\.json["']|results/[\w.-]+\.json["']\)""")
    offenders = [
        p.name
        for p in sorted((ROOT / "benchmarks").glob("*.py"))
        if p.name != "run_file.py" and fixed.search(p.read_text())
    ]
    assert not offenders, f"write through run_file.new_run_file, one file per run: {offenders}"


def test_each_cpu_loop_file_is_one_run_on_one_host():
    files = sorted((RESULTS / "cpu_loop").glob("*.json"))
    assert len(files) >= 5 and not (RESULTS / "cpu_loop.json").exists()
    for f in files:
        d = json.loads(f.read_text())
        hosts = set(re.findall(r"fc-v\d+", json.dumps(d["machine"])))
        assert hosts == {d["host"]} and f.stem.endswith("_" + d["host"]), f.name
        assert f.name.startswith(d["date"].replace(":", "")), f.name
        configs = [r["config"] for r in d["full"]]
        assert len(configs) == len(set(configs)) == len(d["recovered_from"]["configs_of_this_run"]), f.name


def _cited() -> dict[str, list[str]]:
    docs = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs += sorted((ROOT / "notebooks").glob("*.ipynb"))
    docs += [*sorted((ROOT / "workbench" / "data").rglob("README.md")), *sorted(RESULTS.rglob("README.md"))]
    # code cites results in docstrings and comments too; there a folder without a file is where a script writes
    # (``results/end_to_end/<date>_<host>.json``), so only paths to a file count
    sources = [*sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "workbench").rglob("*.py"))]
    cited: dict[str, list[str]] = {}
    for doc in docs + sources:
        for m in re.finditer(r"results/([\w./{},-]+)", doc.read_text()):
            path = m.group(1).rstrip(".,")
            if doc.suffix == ".py" and not Path(path).suffix:
                continue
            for one in _expand(path):
                cited.setdefault(one, []).append(doc.name)
    return cited


def _expand(path: str) -> list[str]:
    """``sandbox_layout/{before,after}_{1,2}.json`` -> the four paths."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in _expand(path[: m.start()] + alt + path[m.end() :])]


def test_every_cited_results_file_exists():
    cited = _cited()
    assert "cpu_loop/2026-12-01T163926_fc-v1045.json" in cited  # the merged-sync figures' run
    assert any(d.endswith(".py") for d in cited.get("tool_call_modes/2026-12-02T092934_fc-v1045-amd-epyc.json", []))
    missing = {p: docs for p, docs in cited.items() if not (RESULTS / p).exists()}
    assert not missing, missing
