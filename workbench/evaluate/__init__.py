"""Evaluate: a policy on held-out tasks, compared with its base, with intervals (notebook 05).

    from workbench.evaluate import EvalConfig, compare, run_eval
    base = run_eval(EvalConfig(model="qwen-coder", tasks="easy-eval[:12]", n=2))
    compare(base, run_eval(EvalConfig(model="qwen-coder", adapter=ADAPTER, tasks="easy-eval[:12]", n=2)))["delta"]
    direct = run_eval(EvalConfig(model="qwen-coder", tasks="easy-eval[:12]", n=2, harness="direct"))
    harness_tax(direct, base)["delta"]     # through opencode minus asked directly, paired by task

Private modules: ``run`` (`run_eval`), ``paired`` (`run_paired`: an adapter and its base interleaved on one engine),
``served`` (every reload an evaluation makes, verified), ``report`` (`compare`, `harness_tax` and their table), ``stats`` (paired deltas,
bootstrap intervals, the sign-flip test), ``adapter_check``, ``learn`` and ``evidence`` (the learning
experiment: probe, pool, train, evaluate; what ships in workbench/data/learning_demo), ``diff`` (two rollouts
side by side), ``rescoring`` (a rollout's logprobs under another policy), ``matrix`` (models x harnesses), ``certification`` + ``certify_checks`` + ``certify_probes`` (is a harness x model training-grade?).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.evaluate.diff import diff_rollouts, render_diff
    from workbench.evaluate.evidence import load_harness_tax, load_shipped, ship, SHIPPED
    from workbench.evaluate.learn import LearnConfig, run_learning
    from workbench.evaluate.certification import CertifyConfig, certify, render_certificate
    from workbench.evaluate.matrix import exact_prompt_ids, harness_table, markdown_table, MatrixConfig, run_matrix
    from workbench.evaluate.report import compare, harness_tax
    from workbench.evaluate.paired import check_resume, run_paired
    from workbench.evaluate.rescoring import delta_widget, rescore
    from workbench.evaluate.run import EvalConfig, run_eval
