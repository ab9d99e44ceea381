"""Stage faces that load their modules on first use: ``import workbench.capture.proxy`` costs nothing until a name is read.

Every stage's ``__init__`` is its public face: one list, its ``if TYPE_CHECKING:`` imports, names what the stage
offers and which private module holds each name. `face` reads that block once (the file's syntax tree, standard
library only) and gives the package ``__all__`` and a PEP 562 ``__getattr__`` that imports a module only when one of
its names is first read; the type checker reads the same imports:

    __all__, __getattr__, __dir__ = face(__name__)
    if TYPE_CHECKING:
        from workbench.capture.proxy import CaptureProxy
        from workbench.capture.client import ProxyClient

Why lazy: the light clients stay light (the rollout runner imports ``ProxyClient``, not OpenEnv's server the proxy
needs, ~3,400 modules and 7-10 s here), and a stage's face never forces its heavy helpers (torch, TRL) on a caller
that wants one dataclass. ``lazy_loader.attach`` does the same; it is not used because graded hooks import
``workbench.tasks`` under a bare system Python in the grading jail (`workbench.verify.hook_runner`), where only the
standard library exists. Standard library only, then.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["face", "typed_homes"]


def typed_homes(init: Path, package: str) -> dict[str, str]:
    """Name -> module (relative to `package`) of every ``from package.module import name`` in the top-level
    ``if TYPE_CHECKING:`` blocks of `init`, in order."""
    homes: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                if not isinstance(imp, ast.ImportFrom) or not (imp.module or "").startswith(f"{package}."):
                    raise ValueError(f"{init}: a face's TYPE_CHECKING block holds only `from {package}.x import ...`")
                homes |= {a.name: imp.module.removeprefix(f"{package}.") for a in imp.names}  # type: ignore[union-attr]
    return homes


def face(package: str) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for `package`, from its ``TYPE_CHECKING`` imports (`typed_homes`).
    Nothing is copied onto the package: every read asks the module (a dict lookup once it is imported), so a name
    patched in its module (a test's monkeypatch) is what the face gives, and stops being given when the patch is
    undone."""
    init = sys.modules[package].__file__
    assert init is not None, package
    homes = typed_homes(Path(init), package)

    def __getattr__(name: str) -> Any:
        try:
            home = homes[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return list(homes), __getattr__, __dir__
