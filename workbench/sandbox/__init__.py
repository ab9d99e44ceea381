"""Sandboxes: where an agent runs, as whom, with what it may see and spend (notebook 01).

    from workbench.sandbox import Sandbox, SandboxLimits
    with Sandbox.create(task.files, isolation="bwrap", limits=SandboxLimits()) as box:
        box.run(["python", "solution.py"])             # a fresh uid, no capability, only its own folders

Private modules: ``session`` (`Sandbox`), ``spec`` (limits, isolation modes), ``command`` (the bwrap command
line), ``files``, ``process``, ``cleanup``, ``net`` (the relay to the one endpoint a sandbox may reach),
``_init`` (the forwarder bwrap runs inside), ``bounded_copy`` (copies that cannot be made to explode),
``probes`` (the set-up checks). docs/sandboxes.md has the threat model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face

__all__ = [
    "copy_tree",
    "CopyLimitError",
    "CopyLimits",
    "force_remove",
    "mount",
    "system_dirs",
    "under",
    "exceeds",
    "check_harness",
    "run_probes",
    "Sandbox",
    "bwrap_available",
    "check_isolation",
    "Isolation",
    "MARKER_ENV",
    "SandboxError",
    "SandboxLimits",
]

__getattr__, __dir__ = face(
    __name__,
    {
        "copy_tree": "bounded_copy",
        "CopyLimitError": "bounded_copy",
        "CopyLimits": "bounded_copy",
        "force_remove": "cleanup",
        "mount": "command",
        "system_dirs": "command",
        "under": "command",
        "exceeds": "files",
        "check_harness": "probes",
        "run_probes": "probes",
        "Sandbox": "session",
        "bwrap_available": "spec",
        "check_isolation": "spec",
        "Isolation": "spec",
        "MARKER_ENV": "spec",
        "SandboxError": "spec",
        "SandboxLimits": "spec",
    },
)

if TYPE_CHECKING:
    from workbench.sandbox.bounded_copy import copy_tree, CopyLimitError, CopyLimits
    from workbench.sandbox.cleanup import force_remove
    from workbench.sandbox.command import mount, system_dirs, under
    from workbench.sandbox.files import exceeds
    from workbench.sandbox.probes import check_harness, run_probes
    from workbench.sandbox.session import Sandbox
    from workbench.sandbox.spec import (
        bwrap_available,
        check_isolation,
        Isolation,
        MARKER_ENV,
        SandboxError,
        SandboxLimits,
    )
