"""Tasks: what the agent is asked to do and how it is graded (notebooks 01 and 04).

    from workbench.tasks import load_task, load_tasks
    task = load_task("easy/3")                  # one task; its id loads it again
    tasks = load_tasks("easy-train[:8]")        # a collection, sliced (specs: `workbench.tasks.catalog`)

A `Task` holds the instruction, the starting files, the examples the agent may see and the held-out tests it
never sees. Private modules: ``catalog`` (the loaders and specs: HumanEval, DeepCoder, the easy set, JSONL),
``record`` (`Task` itself), ``parse`` (DeepCoder rows), ``harbor`` and ``dockerfile`` (Harbor task folders).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.tasks.catalog import EASY_PATH, FIXTURE_PATH, humaneval_path, load_task, load_tasks
    from workbench.tasks.harbor import load_spec, load_specs
    from workbench.tasks.record import Limits, Task, WRITE_HINT
