"""Sandboxes: where an agent runs, as whom, with what it may see and spend (notebook 01).

    from workbench.sandbox import Sandbox, SandboxLimits
    with Sandbox.create(task.files, isolation="bwrap", limits=SandboxLimits()) as box:
        box.run(["python", "solution.py"])             # a fresh uid, no capability, only its own folders

Private modules: ``session`` (`Sandbox`), ``spec`` (limits, isolation modes), ``command`` (the bwrap command
line), ``files``, ``process``, ``cleanup``, ``net`` (the relay to the one endpoint a sandbox may reach),
``_init`` (the forwarder bwrap runs inside), ``bounded_copy`` (copies that cannot be made to explode),
``probes`` (the set-up checks), ``seccomp`` (the syscall filter every bwrap sandbox and grading runs under), ``binds`` (bind sources
checked as root walks them).
docs/sandboxes.md has the threat model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.sandbox._init import CANNOT_START
    from workbench.sandbox.binds import check_bind_source
    from workbench.sandbox.bounded_copy import copy_tree, CopyLimitError, CopyLimits
    from workbench.sandbox.cleanup import force_remove
    from workbench.sandbox.command import mount, system_dirs, under
    from workbench.sandbox.files import exceeds
    from workbench.sandbox.probes import check_harness, run_probes, start_latency
    from workbench.sandbox.seccomp import DENIED, filter_fd, passed_filter
    from workbench.sandbox.session import Sandbox
    from workbench.sandbox.spec import (
        bwrap_available,
        check_isolation,
        Isolation,
        MARKER_ENV,
        SandboxError,
        SandboxLimits,
    )
