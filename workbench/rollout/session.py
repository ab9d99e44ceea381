"""One loop-owning rollout as a session: sandbox + proxy session + harness, then the grade and the artefact.

task -> sandbox -> harness (unmodified opencode, claude-code, ...) <-> capture proxy <-> engine -> verify -> artefact.

`HarnessSession` is the unit: create it (sandbox + proxy session + the harness started), wait for the agent to exit,
read its calls, grade the workspace, write the artefact, close. `workbench.rollout.run` drives it (one rollout that
never raises for its own failures, N in parallel); OpenEnv's harness protocols over it (TRL's
`HarnessRolloutWorker(harness_adapter=None)` drives them) are in `workbench.train.openenv_session`. Nothing of
OpenEnv's is imported here (its capture server alone brings ~3,400 modules): importing this stays cheap.

Each rollout writes the seed artefact's folder (`../shared/seeds/004_*`):

    trace.json          every captured call, in order, as recorded (purpose-tagged, exact ids)
    task.json           instruction and task id (no hidden tests)
    visible_tests.txt   examples the agent could see
    held_out_tests.json the reward's tests (never inside the sandbox)
    summary.json        status, reason, reward, call/turn/tool counts, timings
    events.jsonl        the harness's own event stream; harness.stderr.txt its log; harness.report.txt its file
    workspace/          the final workspace, as verified

    session = HarnessSession(task, client, RolloutConfig(), out_dir=out)
    try:
        session.wait_for_completion()       # TimeoutError at the wall-clock limit
        session.grade()
        session.write_artefact(out)
    finally:
        session.close()
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from workbench.capture import ProxyClient, ProxyError
from workbench.harnesses import HarnessOptions, HarnessRun, get_harness
from workbench.paths import tools_dir
from workbench.runs import atomic_json
from workbench.procs import exit_signal, signal_name
from workbench.rollout.types import RolloutConfig, Status, after_capture, agent_entries
from workbench.rollout.types import call_counts, engine_failure, trace_tool_calls, workspace_files
from workbench.sandbox import CANNOT_START, CopyLimitError, Sandbox, SandboxError
from workbench.tasks import Task
from workbench.verify import VerifyResult, verify as verify_workspace

__all__ = ["HarnessSession"]

# the logs kept in the artefact, by the name they get there (report.txt: `Launch.report`, for those that keep one)
_LOG_COPIES = {"events.jsonl": "events.jsonl", "stderr.txt": "harness.stderr.txt", "report.txt": "harness.report.txt"}


class HarnessSession:
    """One loop-owning rollout: the agent runs to completion on its own; we read back what it did."""

    def __init__(
        self,
        task: Task,
        client: ProxyClient,
        config: RolloutConfig,
        *,
        out_dir: Path | None = None,
        episode_id: str | None = None,
    ) -> None:
        self.task, self.client, self.config = task, client, config
        self.rollout_id = episode_id or uuid.uuid4().hex[:12]
        self.out_dir = out_dir
        self.harness = get_harness(config.harness)
        self.status: Status = "running"
        self.capture_ingest_failed = 0  # turns the proxy answered but could not record (`check_capture`)
        self.reason: str | None = None
        self.exit_code: int | None = None
        self.timings: dict[str, float] = {}
        self.verify_result: VerifyResult | None = None
        self.agent_exited_at: float | None = None  # time.time() when the agent stopped
        self.run_info: HarnessRun | None = None
        self._calls: list[dict[str, Any]] | None = None
        self._report: str | None = None  # the harness's own record of the run (`Launch.report`)
        self._closed = False
        t0 = time.monotonic()
        # Fail fast, before any sandbox exists, when the engine behind the proxy is down.
        self.client.check_engine()
        self.key = self.client.open_session(
            harness=config.harness,
            temperature=config.temperature,
            max_model_calls=config.max_model_calls,
            max_output_tokens=config.max_output_tokens,
            metadata={"task_id": task.id, "rollout_id": self.rollout_id},
        )
        try:
            self.sandbox = Sandbox.create(
                workspace_files(task),
                isolation=config.isolation,
                limits=config.limits,
                ro_paths=[tools_dir()],
                endpoint=self.client.url,
            )
        except SandboxError:
            self.client.close_session(self.key)
            raise
        try:
            self.timings["setup_s"] = time.monotonic() - t0
            instruction = self.harness.task_prompt(task.instruction)
            prompt = self.harness.few_shot_prompt(instruction) if config.few_shot else instruction
            launch = self.harness.launch(
                base_url=self.sandbox.reach(self.client.agent_base_url),
                api_key=self.key,
                model=self.client.model,
                prompt=prompt,
                options=HarnessOptions(
                    max_output_tokens=config.max_output_tokens,
                    context_tokens=config.context_tokens,
                    system_prompt=config.system_prompt,
                    tools=config.tools,
                    session_title=task.id if config.skip_title_call else None,
                ),
            )
            for rel, text in launch.files.items():
                self.sandbox.write_home(rel, text)
            self._report = launch.report
            self._logs = self.sandbox.logs
            self._started = time.monotonic()
            self.proc = self.sandbox.spawn(
                [self.sandbox.inside_home + a[1:] if a.startswith("~/") else a for a in launch.argv],  # ~/: HOME
                stdin=launch.stdin,
                env=launch.env,
                stdout=self._logs / "events.jsonl",
                stderr=self._logs / "stderr.txt",
            )
        except BaseException:
            # The caller never gets this half-made session to close (e.g. ENOSPC writing the logs,
            # a missing harness binary, Ctrl-C): close the sandbox and the proxy session here.
            self.close()
            raise

    # -- the agent --------------------------------------------------------------------------------

    def wait_for_completion(
        self,
        timeout_s: float | None = None,
        *,
        stop: threading.Event | None = None,
        primed: threading.Event | None = None,
    ) -> int:
        """Wait for the agent to exit; TimeoutError at the wall-clock limit (the agent is killed).

        `stop` set (by `run_rollouts` on Ctrl-C: only the main thread receives KeyboardInterrupt)
        ends the agent as ``interrupted`` and raises KeyboardInterrupt in this thread too. `primed` is
        set once the first agent call is at the engine (its prompt is being computed and cached), or
        when the agent ends, whichever comes first (`RolloutConfig.lead_s`).
        """
        # A task may set its own agent time limit (Harbor's agent.timeout_sec): the shorter one wins.
        limit = (
            min(self.config.timeout_s, self.task.agent_timeout_s or float("inf")) if timeout_s is None else timeout_s
        )
        deadline = self._started + limit
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt
                code = self.proc.poll()
                if code is not None:
                    self.exit_code = code
                    break
                if time.monotonic() >= deadline:
                    if self._answered():
                        self._end("timeout", f"no exit after {limit:.0f} s (wall-clock limit)")
                    else:
                        self._end("stalled", f"no model call answered in {limit:.0f} s (wall-clock limit): unscored")
                    raise TimeoutError(self.reason)
                over = self.sandbox.over_quota()
                if over:  # the agent's own doing: scored 0, like a timeout that solved nothing
                    self._end("limit_exceeded", f"{over}: the agent was stopped")
                    return -1
                if primed is not None and not primed.is_set():
                    with contextlib.suppress(ProxyError):
                        # Its first agent call is at the engine: followers need 10-30 s to start opencode
                        # (measured, 7 at once on 2 cores) and vLLM caches the prompt's blocks as it computes
                        # them, so they arrive to a (nearly) computed prefix. Waiting for the reply cost 35 s.
                        if any(c.get("purpose") == "agent" for c in self.client.trace(self.key)):
                            primed.set()
                if self.config.stop_on_upstream_error:
                    with contextlib.suppress(ProxyError):
                        errors = self.client.status(self.key).get("upstream_errors", 0)
                        if errors:
                            status, reason = self._engine_failure(errors)
                            self._end(status, f"{reason}; stopped instead of letting the harness retry")
                            return -1
                time.sleep(0.25)
        except KeyboardInterrupt:
            self._end("interrupted", "interrupted by the user")
            raise
        finally:
            if primed is not None:
                primed.set()  # ended, however: the followers go
            self.timings["harness_s"] = time.monotonic() - self._started
            # Wall clock, so a step can tell how long grading held it after its last agent stopped (grade_tail_s).
            self.agent_exited_at = time.time()
            # Also after a timeout or a stop: what the harness reported so far.
            if self._report:  # read once, kept beside the event stream (`write_artefact` copies both)
                (self._logs / "report.txt").write_text(self.sandbox.read_home(self._report))
            self.run_info = self.harness.parse_events(self._read_log("events.jsonl"), self._read_log("report.txt"))
        if self.status == "running":
            # The harness may give up on a failed engine call before the poll above sees the error
            # (opencode exits on a 400 within a poll interval): still the engine's failure, which
            # the trainer must not score (harness_error would be scored, upstream_error is not),
            # unless the engine refused what the agent sent (agent_error, scored).
            upstream_errors = 0
            with contextlib.suppress(ProxyError):
                upstream_errors = self.client.status(self.key).get("upstream_errors", 0)
            if upstream_errors and (self.config.stop_on_upstream_error or self.run_info.errors or code != 0):
                self.status, reason = self._engine_failure(upstream_errors)
                self.reason = f"{reason}; the harness then exited: " + (
                    self.run_info.errors[0][:300] if self.run_info.errors else f"exit code {code}"
                )
            elif self.run_info.errors:
                self.status, self.reason = "harness_error", self.run_info.errors[0][:500]
            elif code == 127 and CANNOT_START in (stderr := self._read_log("stderr.txt")):
                # the harness never started (its binary is not in the sandbox): the set-up failed, not the agent
                self.status = "setup_failed"
                self.reason = stderr[stderr.index(CANNOT_START) :].splitlines()[0][:300]
            elif code != 0:
                self.status = "crashed"
                sig = exit_signal(code, bwrap=self.sandbox.isolation == "bwrap")
                self.reason = (
                    f"killed by signal {sig} ({signal_name(sig)})" if sig else f"exit code {code}"
                ) + f": {self._read_log('stderr.txt')[-300:].strip()}"
            else:
                self.status = "ok"
        return code

    def _answered(self) -> bool:
        """Whether any model call of this rollout was answered (its reply delivered, or cut at the budget)."""
        try:
            return any(c.get("status") in ("ok", "budget_stop") for c in self.client.trace(self.key))
        except ProxyError:
            return True  # the proxy cannot tell: the agent's timeout, as before

    def _engine_failure(self, upstream_errors: int) -> tuple[Status, str]:
        """The status and reason of a rollout whose engine calls failed: ``agent_error`` (scored) when every failed
        call is the engine refusing the agent's own output (`refused_for_the_agents_output`: a 4xx about the request,
        e.g. a tool call the chat template cannot re-render), ``upstream_error`` (unscored) otherwise: a 5xx, a lost
        connection, a cut stream, or any call it cannot tell."""
        # A failure is counted before its record settles (with the reply's last byte): wait until all are on record.
        failed: list[dict[str, Any]] = []
        deadline = time.monotonic() + 5
        with contextlib.suppress(ProxyError):
            while True:
                failed = [c for c in self.client.trace(self.key) if c["status"] == "upstream_error"]
                if len(failed) >= upstream_errors or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        return engine_failure(failed if len(failed) >= upstream_errors else [])

    def _end(self, status: Status, reason: str) -> None:
        self.status, self.reason = status, reason
        self._stop_agent()

    def _stop_agent(self) -> None:
        """Kill the agent and everything it started, and wait until all of it is gone: a pid namespace takes a moment
        to die after its first process (its init waits for the rest)."""
        self.proc.kill()
        self.sandbox.kill_all()
        self.exit_code = self.proc.poll()

    def _read_log(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self._logs / name).read_text(errors="replace")
        return ""

    def calls(self) -> list[dict[str, Any]]:
        """Every captured call of this rollout (cached once the agent has stopped)."""
        if self._calls is not None:
            return self._calls
        calls = self.client.trace(self.key)
        if self.status == "running":
            return calls
        # opencode exits with its title call in flight: let it land or be cancelled, so the trace says how it ended.
        deadline = time.monotonic() + 5
        while any(c["status"] == "pending" for c in calls) and time.monotonic() < deadline:
            time.sleep(0.2)
            calls = self.client.trace(self.key)
        self._calls = calls
        return calls

    def check_capture(self) -> None:
        """The status once the capture's findings are read (`workbench.rollout.types.after_capture`: a call answered
        but not recorded is ``capture_failed``; an engine failure on a drained replica ``replica_lost``)."""
        findings: list[str] = []
        with contextlib.suppress(ProxyError):
            findings = self.client.findings(self.key)
        self.status, self.reason, self.capture_ingest_failed = after_capture(self.status, self.reason, findings)

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:  # OpenEnv's LoopOwningSession: the agent calls' entries
        return agent_entries(self.calls())

    # -- the reward --------------------------------------------------------------------------------

    def grade(self) -> VerifyResult:
        """Hidden-test reward on a copy of the final workspace (the agent is stopped first)."""
        if self.proc.poll() is None or self.sandbox.strays():
            self._stop_agent()
        t = time.monotonic()
        try:
            self.verify_result = verify_workspace(self.task, self.sandbox.workspace, sandbox=self.sandbox.isolation)
        finally:
            self.timings["verify_s"] = time.monotonic() - t
        return self.verify_result

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sandbox.close()
        finally:
            with contextlib.suppress(ProxyError):
                self.client.close_session(self.key)

    # -- the artefact ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        calls = self._calls if self._calls is not None else []
        run = self.run_info
        r = self.verify_result
        return {
            "rollout_id": self.rollout_id,
            "task_id": self.task.id,
            "harness": self.config.harness,
            "model": self.client.model,
            "status": self.status,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "reward": self.reward,
            "tests_passed": r.passed if r is not None else None,
            "tests_total": r.total if r is not None else None,
            **call_counts(calls),
            # From the engine's own answers as captured: the agent can write anything into the harness's
            # event stream (it runs as the same uid), never into the trace.
            "tool_calls": trace_tool_calls(calls),
            # What the harness's event stream says (its own account; shown, never used for rewards).
            "harness_tool_calls": run.tool_calls if run else {},
            "tool_failures": run.tool_failures if run else {},
            "harness_steps": run.steps if run else 0,
            "harness_errors": run.errors if run else [],
            "solution_written": (self.sandbox.workspace / "solution.py").exists() if not self.sandbox.closed else None,
            "temperature": self.config.temperature,
            "tool_parser": self.config.tool_parser,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "agent_exited_at": self.agent_exited_at,
            "isolation": self.sandbox.isolation,
            # Model calls attempted by any process but the harness's (the agent's shell holds the key):
            # refused, never recorded. None in plain mode, where nothing can tell them apart.
            "refused_model_connections": self.sandbox.refused_connections,
            "capture_ingest_failed": self.capture_ingest_failed,
        }

    @property
    def reward(self) -> float | None:
        """The hidden-test reward; 0 when the agent broke a sandbox limit (its own doing)."""
        if self.verify_result is None:
            return None
        return 0.0 if self.status == "limit_exceeded" else self.verify_result.reward

    def write_artefact(self, out_dir: Path) -> dict[str, Any]:
        """Write the seed-format folder. Safe after a timeout or an interrupt (partial trace kept).
        The folder is ours alone (0700; held_out_tests.json 0600): no sandbox uid can read it."""
        out_dir.mkdir(parents=True, exist_ok=True)
        out_dir.chmod(0o700)
        with contextlib.suppress(ProxyError):
            self.calls()
        summary = self.summary()
        atomic_json(out_dir / "trace.json", self._calls or [])
        atomic_json(out_dir / "task.json", self.task.public_json())
        (out_dir / "visible_tests.txt").write_text(self.task.visible_tests)
        atomic_json(out_dir / "held_out_tests.json", self.task.held_out_tests, mode=0o600)
        for name, copy in _LOG_COPIES.items():
            with contextlib.suppress(OSError):
                shutil.copyfile(self._logs / name, out_dir / copy)
        ws = out_dir / "workspace"
        if not self.sandbox.closed and not ws.exists():
            try:
                self.sandbox.snapshot(ws)
            except CopyLimitError as exc:  # kept as far as it fits; the summary says why not whole
                summary["workspace_truncated"] = str(exc)
            except OSError:
                pass
        if self.verify_result is not None:
            atomic_json(out_dir / "verify.json", self.verify_result.to_json())
        atomic_json(out_dir / "summary.json", summary)  # last: its presence marks a complete folder
        return summary
