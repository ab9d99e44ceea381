"""Verifier hooks: your own Python callable grades a workspace, in the same jail as the built-in grading.

    def score(workspace: Path, task: Task) -> float | dict:   # 0..1, or {"reward": x, "other": 3, ...}
        ...

    verify(task, ws, verifier="my_hooks:score")        # importable from the grader's sys.path
    verify(task, ws, verifier="/abs/path/hooks.py:score")
    Task(..., verifier="my_hooks:score")                # per task (Harbor: metadata.workbench.verifier)

The hook replaces the task's held-out tests (its result is the only "test"). It never runs in the
grader's process: `run_hook` starts `hook_runner` in the grading jail (fresh uid, no capability,
`Limits`, no network, the fresh bounded copy as working directory) as ``python -I -B`` and reads
its answer line. Under bubblewrap the copy is at ``/app`` (the hook's ``workspace`` argument), the
hook's module at ``/run/verifier/`` (a single-file module: that file alone; a package: its folder)
and the ``workbench`` package at ``/run/workbench/lib/`` (for `Task`), all read-only, with the
answers' folders (``workbench/data`` and the others of `paths.private_paths`) masked. In plain mode
(``sandbox="none"``) the same runs at the real paths, reached by the test uid's own file rights.

What a hook may import: the standard library, what the grading interpreter has installed (the
venv's site-packages, read-only), its own package (or the folder of a ``PATH.py`` hook), and
`workbench.tasks.catalog`; nothing else of the project, the run folders or the caches is there. What it
gets: the workspace path and the full `Task` (held-out tests included: they are the grader's).

Results: a finite number in [0, 1], or a dict with such a ``reward`` (other numeric keys kept as
metrics, the rest dropped) -> ``passed`` at 1, else ``wrong`` with the score kept. An exception in
the hook, an exit before answering, a value outside [0, 1] or of another type -> ``error`` (0, the
reason says which); past `Limits.time_s` -> ``timeout``; past the output cap -> ``crash``.

A hook that imports or runs the workspace's code in its own process can be fooled by it (that code
runs as the same uid, in the same interpreter): run the candidate in a subprocess and judge its
output when that matters.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.tasks import Task
from workbench.verify.child import Child, Failed, clip
from workbench.verify.graded import Graded
from workbench.verify.jail import Jail
from workbench.verify.jail_host import reachable

__all__ = ["Hook", "jail_options", "parse_hook", "run_hook"]

_RUNNER = Path(__file__).resolve().with_name("hook_runner.py")
_PACKAGE = _RUNNER.parent.parent  # the workbench package (for workbench.tasks.catalog in the jail)
_LIB_AT, _HOOK_AT = "/run/workbench/lib", "/run/verifier"


@dataclass(frozen=True)
class Hook:
    """A resolved hook: the module to import, the function, and what must be visible for the import."""

    module: str
    function: str
    source: Path  # the module's file (single-file module) or its top-level package's folder
    name: str  # its name inside /run/verifier/ (file or folder)


def parse_hook(spec: str) -> Hook:
    """``module:function`` (found on this process's sys.path, not imported) or ``PATH.py:function``."""
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ValueError(f"verifier hook {spec!r}: expected 'module:function' or 'PATH.py:function'")
    target, function = spec.rsplit(":", 1)
    if not function.isidentifier():
        raise ValueError(f"verifier hook {spec!r}: {function!r} is not a function name")
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file() or not path.stem.isidentifier():
            raise ValueError(f"verifier hook {spec!r}: no Python file {path} (with an importable name)")
        return Hook(path.stem, function, path, path.name)
    if not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"verifier hook {spec!r}: {target!r} is not a module name")
    top = target.split(".")[0]
    found = importlib.util.find_spec(top)  # a top-level name: found, not imported
    if found is None or (found.origin is None and not found.submodule_search_locations):
        raise ValueError(f"verifier hook {spec!r}: no module {top!r} on the grader's path")
    if found.submodule_search_locations:
        return Hook(target, function, Path(next(iter(found.submodule_search_locations))).resolve(), top)
    if found.origin is None or not found.origin.endswith(".py"):
        raise ValueError(f"verifier hook {spec!r}: module {top!r} is not a Python source file")
    return Hook(target, function, Path(found.origin).resolve(), f"{top}.py")


def jail_options(hook: Hook, bwrap: bool) -> dict[str, Any]:
    """`Jail` keyword arguments for running ``hook`` (bwrap: the mounts above; plain mode: none)."""
    if not bwrap:
        return {}
    return {
        "workspace_at": "/app",
        "extra_ro": {f"{_LIB_AT}/workbench": _PACKAGE, f"{_HOOK_AT}/{hook.name}": hook.source},
    }


def run_hook(box: Jail, task: Task, hook: Hook, deadline: float) -> Graded:
    """Call the hook in ``box`` (made with `jail_options`) on its workspace copy."""
    if box.bwrap:
        runner, libs = f"{_LIB_AT}/workbench/verify/hook_runner.py", [_HOOK_AT, _LIB_AT]
    else:
        runner, libs = str(_RUNNER), [str(hook.source.parent), str(_PACKAGE.parent)]
        unreachable = [p for p in (hook.source, _RUNNER) if not _readable(p)]
        if unreachable:
            raise RuntimeError(f"plain grading (sandbox='none'): the test uid cannot read {unreachable[0]}; use bwrap")
    with tempfile.TemporaryFile(dir=box.root) as stdin:
        stdin.write(json.dumps(task.to_json()).encode())
        stdin.seek(0)
        child = Child(box, [box.python, "-I", "-B", runner, hook.module, hook.function, *libs], stdin=stdin)
    try:
        child.finish(deadline)
    except Failed as failed:
        return Graded(failed.outcome, f"verifier hook: {failed.reason}")
    finally:
        child.close()
    lines = child.out.decode("utf-8", errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except (ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        return Graded("error", "verifier hook exited without an answer: " + child.crash_reason(), 0.0)
    if not answer.get("ok"):
        return Graded("error", clip(f"verifier hook raised {answer.get('error')}", 400), 0.0)
    return _scored(answer.get("value"))


def _scored(value: Any) -> Graded:
    metrics: dict[str, float] = {}
    if isinstance(value, dict):
        metrics = {
            str(k): float(v)
            for k, v in value.items()
            if k != "reward" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if "reward" not in value:
            return Graded("error", "verifier hook returned a dict without 'reward'", 0.0, metrics)
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return Graded("error", f"verifier hook returned {clip(repr(value), 60)}: expected a number in [0, 1]", 0.0)
    if not 0.0 <= value <= 1.0:
        return Graded("error", f"verifier hook returned reward {value:g}, outside [0, 1]: refused", 0.0, metrics)
    if value == 1.0:
        return Graded("passed", "", 1.0, metrics)
    return Graded("wrong", f"reward {value:g}", float(value), metrics)


def _readable(path: Path) -> bool:
    return reachable(path.parent) and bool(path.stat().st_mode & 0o004) and os.path.exists(path)
