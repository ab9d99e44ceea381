"""One results file per benchmark run, never overwritten, named by date and host; and the host, described.

Every script here that writes its results by default writes ``benchmarks/results/<benchmark>/<date>_<host>.json``
(``2026-12-02T083000_fc-v1045-amd-epyc.json``): a second run, here or on another host, gets its own file, so a figure
in the docs names one file, one run and one host. An explicit ``--out`` that already exists is refused, not merged
into or replaced. ``host()`` goes into each file: the kernel build (what tells this project's lent hosts apart),
the CPU model and the ISA flags that change the numbers (AMX/AVX512-BF16 make bf16 fast; AVX2 alone makes it 29x
slow: benchmarks/README.md section 7).

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_file import host, new_run_file
    path = new_run_file("cpu_loop")                       # claimed now (exclusive create), written as the run goes
    path = new_run_file("cpu_loop", Path("/tmp/x.json"))   # an explicit path: FileExistsError if it is there
    path.write_text(json.dumps({"machine": host(), ...}))
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
from pathlib import Path

__all__ = ["RESULTS", "host", "host_slug", "new_run_file"]

RESULTS = Path(__file__).resolve().parent / "results"
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the ones this project's numbers depend on


def _cpuinfo() -> tuple[str, list[str]]:
    """(CPU model name, the flags of `_FLAGS` it has) from /proc/cpuinfo; ("unknown", []) elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", []
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    have = set(flags.group(1).split()) if flags else set()
    return (model.group(1).strip() if model else "unknown"), [f for f in _FLAGS if f in have]


def _family_model() -> str | None:
    """``family 25 model 17`` (AMD Zen 4) from /proc/cpuinfo: hosts that all call themselves "AMD EPYC" differ here."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
    return f"family {family.group(1)} model {model.group(1)}" if family and model else None


def host_slug() -> str:
    """A file-name-safe name of this host: the kernel build without its version (``fc-v1045``; the host name when
    the release has no build tag) and the CPU model (``amd-epyc``), lower case."""
    build = re.sub(r"^[\d.]+-?", "", platform.release()) or platform.node() or "host"
    model = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b", "", _cpuinfo()[0], flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", f"{build} {model}".lower()).strip("-")
    return slug[:60] or "host"


def host() -> dict[str, object]:
    """What each results file records about the machine it ran on."""
    model, flags = _cpuinfo()
    return {
        "host": host_slug(),
        "node": platform.node(),
        "platform": platform.platform(),
        "cpu": model,
        "cpu_family_model": _family_model(),
        "cpu_flags": flags,
        "cpus": os.cpu_count(),
    }


def new_run_file(benchmark: str, out: Path | None = None, *, now: dt.datetime | None = None) -> Path:
    """Claim this run's results file (created empty, exclusively) and return it.

    Without ``out``: ``results/<benchmark>/<date>_<host>.json``; two runs in the same second on the same host get
    ``..._2.json``. With ``out``: that path, refused with FileExistsError when it exists (an earlier run's)."""
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "x"):  # FileExistsError: never merge into, or replace, another run's file
            pass
        return out
    folder = RESULTS / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{(now or dt.datetime.now()).strftime('%Y-%m-%dT%H%M%S')}_{host_slug()}"
    for i in range(1, 100):
        path = folder / (f"{stem}.json" if i == 1 else f"{stem}_{i}.json")
        try:
            with open(path, "x"):
                return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}/{stem}*.json: 99 runs in one second")
