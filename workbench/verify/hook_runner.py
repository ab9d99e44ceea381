"""The verifier-hook runner: the jail process that imports a hook and calls it on the workspace copy.

Started by `workbench.verify.hook` as the test uid, inside the grading jail, as
``python -I -B hook_runner.py MODULE FUNCTION LIBDIR...`` with the copy as its working directory and
the task's full record (`Task.to_json`) as JSON on stdin. ``-I``: no PYTHON* variables, no user
site, and neither the working directory nor this file's folder on sys.path, so the workspace's
files import only if the hook imports them on purpose. LIBDIRs go first on sys.path: the hook's own
folder and the folder holding the ``workbench`` package (for `Task`).

It answers one JSON line on its stdout, ``{"ok": true, "value": ...}`` or ``{"ok": false, "error":
...}``; the hook's own prints (and the workspace code's) go to stderr, its stdin reads EOF.
Standard library only, apart from `workbench.tasks.catalog`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

__all__: list[str] = []


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)} line {frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}"[:300] + where


def _main() -> None:
    data = sys.stdin.read()
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # prints go to stderr: stdout carries the answer only
    os.close(null)

    def answer(**message: Any) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    module_name, function, *libs = sys.argv[1:]
    sys.path[:0] = libs
    try:
        from workbench.tasks import Task

        task = Task.from_json(json.loads(data))
        fn = getattr(importlib.import_module(module_name), function, None)
        if not callable(fn):
            answer(ok=False, error=f"the hook module {module_name} has no function {function!r}")
            return
        value = fn(Path(os.getcwd()), task)
    except BaseException as exc:  # noqa: BLE001 - a SystemExit or KeyboardInterrupt in the hook is its failure too
        answer(ok=False, error=_describe(exc))
        return
    try:
        answer(ok=True, value=value)
    except (TypeError, ValueError) as exc:
        answer(ok=False, error=f"the hook returned a value that is not JSON: {exc}"[:300])


if __name__ == "__main__":
    _main()
