"""Verify: the reward, from hidden tests the agent never saw, run in a jail of their own (notebook 04).

    from workbench.verify import verify
    result = verify(load_task("easy/3"), Path("runs/r1/workspace"))
    result.reward, result.passed, result.total  # reward = fraction of the held-out tests passed

Private modules: ``reward`` (`verify`, `verify_many`, shaping; how a verification runs, step by step),
``grading`` (the rules per test kind), ``jail`` (the folder, namespaces, uid and limits of one
verification), ``child`` and ``runner`` (a test process and the program inside it), ``harbor`` (Harbor's
test.sh and reward file), ``oracle`` (a Harbor task's solve.sh must score 1.0), ``hook`` and ``hook_runner`` (your own verifier), ``examples`` (notebook 04's
answer key and hostile solution). docs/sandboxes.md: what a solution cannot do to its grade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.verify.examples import (
        answer_key,
        cannot_show,
        grade_source,
        hostile,
        leaked,
        tests_file,
        verify_rows,
    )
    from workbench.verify.oracle import check_tasks, oracle_check
    from workbench.verify.jail_host import SANDBOXES
    from workbench.verify.reward import (
        sandbox_guards,
        shaped_reward,
        Shaping,
        TestOutcome,
        verify,
        verify_many,
        VerifyResult,
    )
