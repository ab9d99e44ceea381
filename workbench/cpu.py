"""What this host's CPU can do that changes how fast (and how exactly) a step runs: native bfloat16.

bfloat16 pays where the cores have it: AVX512-BF16 or AMX-BF16 (a 2-core AMD EPYC with AVX512-BF16 here: a
[3000, 896] x [896, 4864] matmul 206.6 GFLOP/s in bfloat16 against 72.8 in float32, torch 2.13, 2 threads); on an
AVX2-only CPU torch falls back to a reference kernel that ran 29x slower than float32 (benchmarks/README.md,
section 7). `TrainConfig`'s ``precision`` and ``engine_dtype`` resolve ``auto`` with it.

    from workbench.cpu import bf16_native, cpu_flags
    bf16_native()        # True on AVX512-BF16 / AMX-BF16 hosts
    cpu_flags()          # ("avx2", "avx512_bf16", ...): the flags of `FLAGS` this host has
    machine()            # {"cpu": "AMD EPYC family 26 model 2", "kernel": "...", "flags": [...]}: what a resume records
"""

from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

__all__ = ["FLAGS", "BF16_FLAGS", "cpu_flags", "bf16_native", "machine"]

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the ones this project's numbers depend on
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The flags of `FLAGS` in /proc/cpuinfo (empty where there is none to read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    found = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    have = set(found.group(1).split()) if found else set()
    return tuple(f for f in FLAGS if f in have)


def bf16_native() -> bool:
    """Whether the cores compute bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


def machine(cpuinfo: str | None = None) -> dict[str, object]:
    """The machine a run's stage ran on, for its resume records: a VM's host name says nothing (``vm`` on every one
    here), and a run resumed on another machine (a 2-core Zen 4 one day, a Zen 5 the next) runs its later steps at
    another speed. The CPU's model name with its family and model, the kernel release (its build tag names the VM
    image) and `cpu_flags`. `cpuinfo` stands in for /proc/cpuinfo (tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""

    def field(name: str) -> str:
        found = re.search(rf"^{name}\s*:\s*(.*)$", cpuinfo, re.M)
        return found.group(1).strip() if found else "?"

    return {
        "cpu": f"{field('model name')} family {field('cpu family')} model {field('model')}",
        "kernel": platform.release(),
        "flags": list(cpu_flags()),
    }
