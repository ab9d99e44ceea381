"""Stage faces that load their modules on first use: ``import workbench.capture.proxy`` costs nothing until a name is read.

Every stage's ``__init__`` is its public face: it names what the stage offers (``__all__``), which private module
holds each name, and imports that module only when the name is first read (PEP 562's module ``__getattr__``):

    __all__ = ["CaptureProxy", "ProxyClient"]
    __getattr__, __dir__ = face(__name__, {"CaptureProxy": "proxy", "ProxyClient": "client"})
    if TYPE_CHECKING:  # what the type checker reads; tests/test_imports.py checks both lists agree
        from workbench.capture.proxy.proxy import CaptureProxy
        from workbench.capture.proxy.client import ProxyClient

Why lazy: the light clients stay light (the rollout runner imports ``ProxyClient``, not OpenEnv's server the proxy
needs, ~3,400 modules and 7-10 s here), and a stage's face never forces its heavy helpers (torch, TRL) on a caller
that wants one dataclass. ``lazy_loader.attach`` does the same; it is not used because graded hooks import
``workbench.tasks`` under a bare system Python in the grading jail (`workbench.verify.hook_runner`), where only the
standard library exists. Standard library only, then.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["face"]


def face(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for `package`, whose public `homes` map each name to the module (relative to
    the package) that defines it. Nothing is copied onto the package: every read asks the module (a dict lookup
    once it is imported), so a name patched in its module (a test's monkeypatch) is what the face gives, and
    stops being given when the patch is undone."""
    homes = dict(homes)

    def __getattr__(name: str) -> Any:
        try:
            home = homes[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
