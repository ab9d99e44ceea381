"""The isolation modes a test may run the real harness in from this checkout (imported like
`scripted_upstream`): bwrap where it works, and plain mode where a fresh uid can walk to the harness
install on its own rights. Below a 0700 folder (root's home, a `mktemp -d`) it cannot, by design:
plain mode then refuses to start (`sandbox_spec.check_plain_mode`) and its tests are skipped, saying why.

    @pytest.mark.parametrize("isolation", HARNESS_ISOLATIONS)    # plain mode skipped, saying why
    for mode in HARNESS_MODES: ...                                  # the modes that run here
"""

from __future__ import annotations

import os

import pytest

from workbench.paths import project_root
from workbench.sandbox.spec import blocking_folder, bwrap_available

__all__ = ["HARNESS_ISOLATIONS", "HARNESS_MODES"]

_blocker = blocking_folder(project_root() / "tools" / "node_modules") if os.geteuid() == 0 else None
_PLAIN = pytest.param(
    "none",
    marks=pytest.mark.skipif(
        _blocker is not None,
        reason=f"plain mode: a fresh uid cannot enter {_blocker} on the way to the harness install (bwrap runs instead)",
    ),
)
HARNESS_ISOLATIONS = [_PLAIN] + (["bwrap"] if bwrap_available() else [])
HARNESS_MODES = ([] if _blocker is not None else ["none"]) + (["bwrap"] if bwrap_available() else [])
