"""A hostile agent and a hostile solution, in every mode that training allows.

Training and evaluation run the agent under bubblewrap (`bwrap`); plain mode (`none`) needs an
explicit unsafe flag, and is tested here for what it still promises (a fresh uid with no
capability: no root, no raw sockets, no other rollout's files, no leftover process, answers out of
reach). Each attack is what the agent's bash tool would run: a command in its sandbox, as its uid,
in its namespaces (`Sandbox.run`); the attacks on the reward go through `verify` with a hostile
workspace; the attacks on the proxy speak HTTP to a real `CaptureProxy`; two go through the real
opencode (a scripted engine making it run the command).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from scripted_upstream import ScriptedUpstream
from workbench.sandbox import CopyLimitError, Sandbox, SandboxLimits, bwrap_available, check_isolation
from workbench.capture import CaptureProxy
from workbench.paths import exposed_paths, private_paths, project_root
from workbench.procs import processes
from workbench.rollout import run_rollout, RolloutConfig
from workbench.tasks import Limits, Task, load_task
from workbench.verify import verify, verify_many

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are written for the root case (CI, this machine)"
)
MODES = ["none"] + (["bwrap"] if bwrap_available() else [])
BWRAP = pytest.mark.skipif(not bwrap_available(), reason="bwrap is not installed (scripts/setup.sh installs it)")


def _run(sb: Sandbox, script: str, timeout_s: float = 60) -> tuple[int, str]:
    return sb.run(["bash", "-c", script], timeout_s=timeout_s)


# ----------------------------------------------------------------------------------- no root, no caps


@pytest.mark.parametrize("mode", MODES)
def test_agent_is_never_root_and_holds_no_capability(base, mode):
    with Sandbox.create({}, isolation=mode, base_dir=base) as sb:
        code, out = _run(sb, "id -u; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status")
    lines = dict(line.split(":", 1) for line in out.strip().splitlines()[1:])
    assert code == 0 and out.split()[0] != "0" and int(out.split()[0]) == sb.uid
    assert {k: v.strip() for k, v in lines.items()} == {
        "NoNewPrivs": "1",
        "CapPrm": "0" * 16,
        "CapEff": "0" * 16,
        "CapBnd": "0" * 16,
        "CapAmb": "0" * 16,
    }


@BWRAP
def test_cgroup_release_agent_escape_is_refused(base):
    """The escape that worked under root's bwrap: mount a cgroup-v1 hierarchy and set its
    release_agent. With no capability (and no nested user namespace to get one) the mount fails."""
    with Sandbox.create({}, isolation="bwrap", base_dir=base) as sb:
        code, out = _run(
            sb,
            "mkdir -p $TMPDIR/cg; mount -t cgroup -o rdma cgroup $TMPDIR/cg 2>&1; echo mount=$?; "
            "unshare --user --map-root-user true 2>&1; echo userns=$?; "
            "test -w /sys/fs/cgroup && echo cgroup-writable || echo cgroup-read-only",
        )
    assert "mount=0" not in out and "userns=0" not in out, out
    assert "cgroup-writable" not in out


@pytest.mark.parametrize("mode", MODES)
def test_no_raw_sockets_to_sniff_the_loopback(base, mode):
    probe = (
        "python - <<'EOF'\nimport socket\ntry:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300)\n"
        "    print('raw socket opened')\nexcept OSError as e:\n    print('refused', e.errno)\nEOF"
    )
    with Sandbox.create({}, isolation=mode, base_dir=base) as sb:
        _, out = _run(sb, probe)
    assert out.startswith("refused"), out


# --------------------------------------------------------------------------------------- the network


class _Listener:
    """A TCP server on the host's loopback that counts who reached it (the engine, the proxy's
    control port, anything)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            conn.sendall(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok")
            conn.close()


@BWRAP
def test_under_bwrap_only_the_endpoint_is_reachable(base):
    """The engine and every other host port are out of reach; the endpoint given is relayed in."""
    engine, endpoint = _Listener(), _Listener()
    url = f"http://127.0.0.1:{endpoint.port}"
    with Sandbox.create({}, isolation="bwrap", base_dir=base, endpoint=url) as sb:
        fetch = (
            "python - <<'EOF'\nimport urllib.request\nfor port in ({e}, {p}):\n    try:\n"
            "        print(port, urllib.request.urlopen(f'http://127.0.0.1:{{port}}/', timeout=3).read())\n"
            "    except OSError as e:\n        print(port, 'unreachable')\nEOF"
        ).format(e=engine.port, p=endpoint.port)
        _, out = _run(sb, fetch)
    assert f"{engine.port} unreachable" in out and f"{endpoint.port} b'ok'" in out, out
    assert engine.hits == 0 and endpoint.hits == 1


@BWRAP
def test_slow_connections_starve_only_their_own_sandbox(base):
    """300 connections held open from one sandbox: its relay admits max_connections, the rest are
    refused at once; another sandbox's calls to the same endpoint go through as usual."""
    endpoint = _Listener()
    url = f"http://127.0.0.1:{endpoint.port}"
    limits = SandboxLimits(max_connections=8)
    hog = (
        "python - <<'EOF'\nimport socket, time\nheld = []\nfor _ in range(300):\n    s = socket.socket()\n"
        f"    s.connect(('127.0.0.1', {endpoint.port}))\n    s.send(b'G')\n    held.append(s)\ntime.sleep(30)\nEOF"
    )
    with (
        Sandbox.create({}, isolation="bwrap", base_dir=base, endpoint=url, limits=limits) as a,
        Sandbox.create({}, isolation="bwrap", base_dir=base, endpoint=url, limits=limits) as b,
    ):
        hog_proc = a.spawn(["bash", "-c", hog])
        deadline = time.monotonic() + 20
        while (a._relay.refused < 250) and time.monotonic() < deadline:  # noqa: SLF001 - the relay's counter
            time.sleep(0.2)
        t = time.monotonic()
        code, out = _run(
            b, f"python -c \"import urllib.request; print(urllib.request.urlopen('{url}/', timeout=5).read())\""
        )
        took = time.monotonic() - t
        hog_proc.kill()
    assert a._relay.served <= 8 and a._relay.refused >= 250  # noqa: SLF001
    assert code == 0 and "b'ok'" in out and took < 5, (out, took)


# -------------------------------------------------------------------------------- files and processes


@pytest.mark.parametrize("mode", MODES)
def test_answers_and_other_rollouts_are_out_of_reach(base, mode):
    """Task data, HumanEval's canonical solutions, run folders (held-out tests), caches and another
    sandbox's workspace: invisible under bwrap, unreadable (0700, another uid) in plain mode."""
    assert exposed_paths() == []  # set-up made them private
    with (
        Sandbox.create({"secret.py": "x = 1\n"}, isolation=mode, base_dir=base) as other,
        Sandbox.create({}, isolation=mode, base_dir=base) as sb,
    ):
        targets = [*private_paths(), other.workspace / "secret.py", Path("/opt")]
        script = "; ".join(f"ls {p} >/dev/null 2>&1 && echo 'READ {p}' || echo 'denied {p}'" for p in targets)
        _, out = _run(sb, script + f"; echo x > {other.workspace}/planted 2>/dev/null && echo WROTE")
    readable = [line for line in out.splitlines() if line.startswith("READ") and not line.endswith("/opt")]
    assert readable == [] and "WROTE" not in out, out
    if mode == "bwrap":
        assert "denied /opt" in out


@pytest.mark.parametrize("mode", MODES)
def test_process_limit_holds(base, mode):
    """RLIMIT_NPROC counts the sandbox's fresh uid only, so it holds (root ignored it before)."""
    with Sandbox.create({}, isolation=mode, base_dir=base, limits=SandboxLimits(nproc=40)) as sb:
        _, out = _run(
            sb,
            "n=0; for i in $(seq 100); do (sleep 5 &) 2>/dev/null && n=$((n+1)); done; "
            'sleep 0.5; ps -e --no-headers -o uid | grep -c "^ *$(id -u)$"',
        )
        alive = int(out.strip().splitlines()[-1])
    assert alive <= 40, out


@pytest.mark.parametrize("mode", MODES)
def test_no_process_outlives_the_sandbox(base, mode):
    """A process that left the group, cleared its environment and waits to rewrite the run's files
    is killed with the sandbox (every process of its uid), and could not have written there."""
    run_folder = base / "run"
    run_folder.mkdir(mode=0o700)
    (run_folder / "summary.json").write_text('{"reward": 0.0}')
    with Sandbox.create({}, isolation=mode, base_dir=base) as sb:
        uid = sb.uid
        _, out = _run(
            sb,
            f"setsid env -i sh -c 'sleep 3; echo 1.0 > {run_folder}/summary.json' >/dev/null 2>&1 & "
            f"echo {{}} > {run_folder}/summary.json 2>/dev/null && echo WROTE; echo started",
        )
        assert "WROTE" not in out
    assert not [p for p in processes() if p.uid == uid]
    time.sleep(3.5)
    assert (run_folder / "summary.json").read_text() == '{"reward": 0.0}'


@pytest.mark.parametrize("mode", MODES)
def test_writes_are_bounded(base, mode):
    """/tmp is a small tmpfs (host memory); the sandbox's folders are measured against disk_mb."""
    limits = SandboxLimits(disk_mb=8, file_size_mb=4)
    with Sandbox.create({}, isolation=mode, base_dir=base, limits=limits) as sb:
        uid = sb.uid
        _, out = _run(
            sb,
            "dd if=/dev/zero of=/tmp/fill bs=1M count=16 2>&1 | tail -1; "
            "mkdir /tmp/wb-left; head -c 1000 /dev/zero > /tmp/wb-left/f; chmod 000 /tmp/wb-left; "
            "for i in 1 2 3 4; do head -c 3000000 /dev/zero > ws_$i; done; echo done",
        )
        over = sb.over_quota()
        if mode == "none":  # the host's /tmp: it wrote there as its own uid
            assert {p.name for p in Path("/tmp").iterdir() if p.lstat().st_uid == uid} == {"fill", "wb-left"}
    assert "done" in out and over is not None and "8 MiB" in over
    if mode == "bwrap":
        assert "16 MB" not in out and "16777216" not in out  # the tmpfs stopped it at 4 MiB
    # closed: nothing of its uid is left in the folders every user may write to (plain mode shares the host's)
    assert not [p for d in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(d).iterdir() if p.lstat().st_uid == uid]


def test_removing_what_a_uid_left_touches_nothing_else_and_follows_no_link(tmp_path):
    from workbench.sandbox.cleanup import remove_owned

    theirs, ours = 1_234_567, os.geteuid()
    (tmp_path / "file").write_text("x")
    (tmp_path / "tree" / "deep").mkdir(parents=True)
    (tmp_path / "tree" / "deep" / "f").write_text("x")
    target = tmp_path / "kept"
    target.mkdir()
    (target / "precious").write_text("x")
    (tmp_path / "link").symlink_to(target)
    for name in ("file", "tree", "tree/deep", "tree/deep/f"):
        os.chown(tmp_path / name, theirs, theirs)
    os.lchown(tmp_path / "link", theirs, theirs)
    (tmp_path / "tree").chmod(0)
    (tmp_path / "mine").write_text("x")
    removed = remove_owned(theirs, (tmp_path,))
    assert sorted(Path(p).name for p in removed) == ["file", "link", "tree"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "mine"]
    assert (target / "precious").read_text() == "x" and (tmp_path / "mine").stat().st_uid == ours


def test_sparse_and_deep_workspaces_cannot_sink_the_copy(base):
    ws = base / "ws"
    ws.mkdir()
    with open(ws / "hole", "wb") as f:
        f.truncate(100 << 30)  # 100 GiB apparent, nothing allocated
    with pytest.raises(CopyLimitError, match="MiB"):
        from workbench.sandbox import copy_tree

        copy_tree(ws, base / "copy")


# ------------------------------------------------------------------------------ the reward (grading)

ADD = Task(
    id="t/add",
    instruction="",
    files={},
    visible_tests="",
    test_kind="function_call",
    entry_point="add",
    held_out_tests=[{"input": [1, 2], "output": [3]}, {"input": [2, 2], "output": [4]}],
    limits=Limits(time_s=6.0, deadline_s=60.0),
)


def _workspace(base: Path, files: dict[str, str]) -> Path:
    ws = Path(tempfile.mkdtemp(dir=base))
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


@pytest.mark.parametrize("mode", MODES)
def test_graded_code_is_never_root_and_cannot_read_answers(base, mode):
    spy = (
        "import os, glob\ndef add(a, b):\n    status = open('/proc/self/status').read()\n"
        "    caps = [l for l in status.splitlines() if l.startswith('CapEff')][0].split()[1]\n"
        "    seen = []\n    for p in " + repr([str(p) for p in private_paths()]) + ":\n"
        "        try:\n            seen += os.listdir(p)\n        except OSError:\n            pass\n"
        "    if os.getuid() == 0 or caps != '0' * 16 or seen:\n        return a + b\n    return -1\n"
    )
    result = verify(ADD, _workspace(base, {"solution.py": spy}), sandbox=mode)
    assert result.reward == 0.0, result.table()


@pytest.mark.parametrize("mode", MODES)
def test_a_workspace_that_breaks_the_grader_scores_zero_not_unscored(base, mode):
    """A 600-deep tree, a 100 GiB sparse file: reward 0 with a reason, never an exception (which
    left the rollout unscored, and sank a whole verify_many batch)."""
    deep = _workspace(base, {"solution.py": "def add(a, b):\n    return a + b\n"})
    d = deep
    for _ in range(600):
        d = d / "d"
        os.mkdir(d)
    sparse = _workspace(base, {"solution.py": "def add(a, b):\n    return a + b\n"})
    with open(sparse / "hole", "wb") as f:
        f.truncate(100 << 30)
    honest = _workspace(base, {"solution.py": "def add(a, b):\n    return a + b\n"})
    results = verify_many([(ADD, deep), (ADD, sparse), (ADD, honest)], workers=1, progress=False, sandbox=mode)
    assert [r.reward for r in results] == [0.0, 0.0, 1.0]
    assert all("cannot be graded" in t.reason for r in results[:2] for t in r.tests)
    subprocess.run(["rm", "-rf", str(deep)], check=True)


@pytest.mark.parametrize("mode", MODES)
def test_hostile_return_values_are_outcomes_not_crashes(base, mode):
    """A value nested 100k deep, and a set whose __iter__ yields 200k integers with one hash (quadratic
    for the grader to build, free for the solution): each test ends as a crash outcome, quickly."""
    nested = "def add(a, b):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v\n"
    colliding = (
        "class Lazy(set):\n    def __iter__(self):\n        return (i * (2**61 - 1) for i in range(200000))\n"
        "def add(a, b):\n    return Lazy()\n"
    )
    for source in (nested, colliding):
        t = time.monotonic()
        result = verify(ADD, _workspace(base, {"solution.py": source}), sandbox=mode)
        assert result.reward == 0.0 and all(o.outcome == "crash" for o in result.tests), result.table()
        assert time.monotonic() - t < 30, result.table()


def test_decoding_bounds_what_it_hashes():
    """Even a well-formed answer of 200k colliding set members is refused before it is hashed."""
    from workbench.verify.runner import decode

    t = time.monotonic()
    with pytest.raises(ValueError, match="set or dict members"):
        decode({"__set__": [i * (2**61 - 1) for i in range(200000)]})
    assert time.monotonic() - t < 1


@pytest.mark.parametrize("mode", MODES)
def test_the_graded_code_is_solution_py_itself(base, mode):
    """A `solution/` package beside solution.py, or a stale __pycache__, is not what gets graded."""
    honest_wrong = "def add(a, b):\n    return 0\n"
    package = _workspace(
        base, {"solution.py": honest_wrong, "solution/__init__.py": "def add(a, b):\n    return a + b\n"}
    )
    assert verify(ADD, package, sandbox=mode).reward == 0.0
    cached = _workspace(base, {"solution.py": "def add(a, b):\n    return a + b\n"})
    subprocess.run(["python3", "-m", "py_compile", str(cached / "solution.py")], check=True)
    pyc = next((cached / "__pycache__").iterdir())
    (cached / "solution.py").write_text("def add(a, b):\n    return 0\n")  # same size: the .pyc looks fresh
    os.utime(cached / "solution.py", (pyc.stat().st_mtime, (cached / "solution.py").stat().st_mtime))
    assert verify(ADD, cached, sandbox=mode).reward == 0.0


def test_training_refuses_plain_mode_unless_asked():
    with pytest.raises(ValueError, match="unsafe-no-sandbox"):
        check_isolation("none", False)
    assert check_isolation("none", True) == "none"


# ---------------------------------------------------------------------------------------- the proxy


@pytest.fixture
def up():
    u = ScriptedUpstream().start()
    yield u
    u.stop()


@pytest.fixture
def proxy(up):
    with CaptureProxy(up.url, "scripted") as p:
        yield p


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_401_comes_from_the_headers_before_any_body(proxy, up):
    """An unauthenticated request announcing 28 MB is refused at once, before a byte of its body."""
    with socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 28000000\r\n\r\n"
        )
        s.settimeout(5)
        t = time.monotonic()
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 401") and time.monotonic() - t < 2, head[:200]
    assert up.requests == []


def test_paths_and_duplicate_keys_that_reached_the_engine_unrecorded(proxy, up):
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    auth = {"Authorization": f"Bearer {key}"}
    body = json.dumps(BODY).encode()
    for path in (
        "/sessions/../v1/chat/completions",
        "/sessionsX/v1/chat/completions",
        f"/sessions/{key}/v1/chat/completions",
        "/v1/chat/completions/",
        # Anthropic and Google are served (tests/test_dialects.py), at their exact paths only
        "/v1/messages/",
        "/v1/complete",
        "/v1beta/models/../sessions:generateContent",
        "/v1beta/models/x:generateContent/../../../sessions",
    ):
        with socket.create_connection(("127.0.0.1", proxy.port)) as s:  # raw: httpx would normalise ".."
            s.sendall(
                f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: "
                f"application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            s.settimeout(10)
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 404"), (path, head[:100])
    dup = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json=BODY,
        timeout=10,
        headers=[("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {proxy.admin_key}")],
    )
    both = httpx.post(f"{proxy.url}/v1/chat/completions", json=BODY, timeout=10, headers={**auth, "x-api-key": "other"})
    assert dup.status_code == 400 and both.status_code == 400
    assert up.requests == [] and client.trace(key) == []
    ok = httpx.post(f"{proxy.url}/v1/chat/completions", json=BODY, headers=auth, timeout=30)
    assert ok.status_code == 200 and len(up.requests) == 1 and len(client.trace(key)) == 1


def test_malformed_or_deep_bodies_are_400_and_the_trace_stays_readable(proxy, up):
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    auth = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    bodies = [
        json.dumps({"messages": 5}),
        json.dumps({"messages": [5]}),
        "[" * 100000 + "]" * 100000,
        json.dumps({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}),
        '{"messages": [{"role": "user", "content": ' + "[" * 70 + "1" + "]" * 70 + "}]}",
    ]
    for body in bodies:
        r = httpx.post(f"{proxy.url}/v1/chat/completions", content=body, headers=auth, timeout=10)
        assert r.status_code == 400, (body[:60], r.status_code, r.text)
    calls = client.trace(key)  # 200: every refused call recorded, readable
    assert [c["status"] for c in calls] == ["rejected"] * len(bodies) and up.requests == []


def test_closing_a_session_mid_call_is_clean(proxy, up):
    up.script = ["hang:3"]
    client = proxy.client()
    key = client.open_session(harness="opencode", temperature=1.0)
    result: dict = {}

    def call() -> None:
        try:
            result["r"] = httpx.post(
                f"{proxy.url}/v1/chat/completions", json=BODY, timeout=30, headers={"Authorization": f"Bearer {key}"}
            )
        except httpx.HTTPError as exc:
            result["error"] = exc

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1)
    client.close_session(key)
    t.join(30)
    assert "r" in result or "error" in result
    # and the proxy still serves: a new session's call goes through
    key2 = client.open_session(harness="opencode", temperature=1.0)
    r = httpx.post(
        f"{proxy.url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key2}"}, timeout=30
    )
    assert r.status_code == 200 and len(client.trace(key2)) == 1


# ------------------------------------------------------------------------- through the real opencode


@BWRAP
def test_forged_harness_events_do_not_count(base, up, proxy):
    """The agent writes fake tool-use events into opencode's own stdout (/proc/PPID/fd/1): the
    summary's tool counts come from the engine's answers in the trace, which it cannot touch."""
    fake = json.dumps({"type": "tool_use", "part": {"tool": "write", "state": {"status": "completed"}}})
    up.untooled = "text"
    up.script = [f"bash:for i in 1 2 3 4 5; do echo '{fake}' > /proc/$PPID/fd/1; done; echo ok", "text"]
    result = run_rollout(
        load_task("easy/0"), proxy.client(), RolloutConfig(timeout_s=120, isolation="bwrap"), base / "r0"
    )
    summary = result.summary
    assert summary["tool_calls"] == {"bash": 1}, summary


@pytest.mark.parametrize("mode", MODES)
def test_notebook_probes_leave_nothing_on_the_host(base, mode):
    """Notebook 01's probes, in either mode: the write probe is refused (no root), and nothing it
    could have made stays."""
    from workbench.sandbox import run_probes

    before = set(os.listdir("/usr"))
    with Sandbox.create({}, isolation=mode, base_dir=base) as sb:
        rows = {r["probe"]: r["output"] for r in run_probes(sb, project=project_root())}
    assert rows["write outside the workspace"] == "refused" and set(os.listdir("/usr")) == before
    assert rows["runs as (uid, capabilities)"].startswith(f"uid={sb.uid} CapEff:")


def test_no_assert_guards_request_input():
    """`python -O` strips asserts: nothing a request sends may be checked with one."""
    import ast

    for module in (
        "capture/proxy.py",
        "capture/gate.py",
        "capture/openenv.py",
        "capture/record.py",
        "capture/relay.py",
        "capture/stream.py",
        "capture/upstream.py",
        "capture/ingest.py",
        "sandbox/net.py",
    ):
        tree = ast.parse((project_root() / "workbench" / module).read_text())
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert asserts == [], (module, asserts)


def test_removing_a_sandbox_tree_changes_no_mode_above_it(tmp_path):
    """A sweep and a close racing on one sandbox root once chmodded its parent (/tmp) to 0700, and every
    later sandbox's uid was refused its workspace. A tree the agent locked (000) still goes."""
    from workbench.sandbox import force_remove

    base = tmp_path / "base"
    locked = base / "root" / "ws" / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    locked.chmod(0o000)
    base.chmod(0o1777)
    force_remove(base / "root")
    assert not (base / "root").exists()
    force_remove(base / "root")  # already gone (the race): nothing to do, and nothing chmodded
    force_remove(base / "never-was")
    assert (base.stat().st_mode & 0o7777) == 0o1777


def test_the_grading_jail_removal_changes_no_mode_above_it(base, monkeypatch):
    """The jail removed its folder with a twin of the sandbox's old removal: a failure on the jail's
    folder itself chmodded its parent (the temp dir) to 0700. Here the jail folder's own removal is
    refused once (a seam: a sweep racing, a parent refusing); its parent keeps its mode, and the
    folder goes on the next removal. A tree the graded code locked (000) still goes."""
    from workbench.verify.jail import Jail
    from workbench.verify.jail_host import resolve

    host, use_bwrap = resolve("auto")
    real_rmdir, refused = os.rmdir, []

    def refuse_jail_folder_once(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith("wb-verify-") and not refused:
            refused.append(path)
            raise PermissionError(13, "refused (test seam)", os.fspath(path))
        return real_rmdir(path, *args, **kwargs)

    base.chmod(0o1777)
    with Jail(ADD.limits, host, bwrap=use_bwrap) as jail:
        locked = jail.root / "tmp" / "locked"
        locked.mkdir(parents=True)
        (locked / "f").write_text("x")
        locked.chmod(0o000)
        monkeypatch.setattr(os, "rmdir", refuse_jail_folder_once)
    assert refused, "the seam never fired: the jail folder was not removed through os.rmdir"
    assert (base.stat().st_mode & 0o7777) == 0o1777
    assert [p.name for p in base.iterdir()] == [jail.root.name]  # refused once: still there, emptied
    assert list(jail.root.iterdir()) == []
    jail.__exit__(None, None, None)  # the next removal takes it
    assert list(base.iterdir()) == []


def _swap_for_link_on_first_unlink(monkeypatch, folder: Path, victim: Path) -> list[str]:
    """A seam for the race an attacker runs against a removal: the first unlink of a file named ``f``
    fails, and by then ``folder`` has been moved aside and a link to `victim` put in its place."""
    real_unlink, fired = os.unlink, []

    def unlink(path, *args, **kwargs):
        if os.path.basename(os.fspath(path)) == "f" and not fired:
            fired.append(os.fspath(path))
            folder.rename(folder.with_name(folder.name + ".moved"))
            folder.symlink_to(victim)
            raise PermissionError(13, "refused (test seam)", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return fired


def _victim(base: Path) -> Path:
    victim = base / "victim"
    victim.mkdir(mode=0o755)
    victim.chmod(0o755)
    (victim / "f").write_text("keep me")
    return victim


def test_the_stale_sweep_leaves_folders_it_did_not_make(base, monkeypatch):
    """`remove_stale` removed, as root, any ``wb-sbx-<dead pid>-…`` folder in the shared temp dir,
    whoever made it; with the swap of `_swap_for_link_on_first_unlink` inside a planted one, root
    chmodded the link's target (any directory) to 0700 and removed a file in it. Now only folders
    lstat shows are ours (our euid, a real directory) are swept."""
    from workbench.sandbox.cleanup import remove_stale

    victim = _victim(base)
    planted = base / "wb-sbx-999999999-1-planted"
    (planted / "sub").mkdir(parents=True)
    (planted / "sub" / "f").write_text("x")
    for path in (planted, planted / "sub", planted / "sub" / "f"):
        os.chown(path, 4242, 4242)  # another user's (an agent's uid in plain mode can write /tmp)
    (base / "wb-sbx-999999998-1-linked").symlink_to(victim)
    ours = base / "wb-sbx-999999997-1-ours"
    (ours / "ws").mkdir(parents=True)
    fired = _swap_for_link_on_first_unlink(monkeypatch, planted / "sub", victim)
    remove_stale(base)
    assert (victim.stat().st_mode & 0o7777) == 0o755 and (victim / "f").read_text() == "keep me"
    assert (planted / "sub" / "f").read_text() == "x" and not fired  # not ours: not touched at all
    assert (base / "wb-sbx-999999998-1-linked").is_symlink()
    assert not ours.exists()  # a stale folder of ours still goes


def test_a_swept_folder_swapped_for_a_link_chmods_nothing_outside(base, monkeypatch):
    """Inside a folder that is ours, a subfolder swapped for a link mid-removal (the removal's error
    handler then chmodded and unlinked by path, through the link): nothing outside changes, and the
    whole tree, moved part included, still goes."""
    from workbench.sandbox.cleanup import remove_stale

    victim = _victim(base)
    ours = base / "wb-sbx-999999997-1-ours"
    (ours / "sub").mkdir(parents=True)
    (ours / "sub" / "f").write_text("x")
    fired = _swap_for_link_on_first_unlink(monkeypatch, ours / "sub", victim)
    remove_stale(base)
    assert fired
    assert (victim.stat().st_mode & 0o7777) == 0o755 and (victim / "f").read_text() == "keep me"
    assert sorted(p.name for p in base.iterdir()) == ["victim"]


def _swap_after_lstat(monkeypatch, name: str, swap) -> list[str]:
    """A seam for the race against `copy_tree`: right after it lstats an entry called `name`, `swap`
    replaces that entry (what an agent still running does between the check and the open)."""
    real_lstat, fired = os.lstat, []

    def lstat(path, *args, **kwargs):
        st = real_lstat(path, *args, **kwargs)
        if os.path.basename(os.fspath(path)) == name and not fired:
            fired.append(os.fspath(path))
            swap()
        return st

    monkeypatch.setattr(os, "lstat", lstat)
    return fired


@pytest.mark.parametrize("swap", ["file-for-link", "file-for-fifo", "folder-for-link"])
def test_the_grading_copy_reads_nothing_swapped_in_after_its_check(base, monkeypatch, swap):
    """`copy_tree` checked each entry with lstat and then opened it by path: a file swapped for a link
    to a host file (or a folder for a link to a host folder) was copied, as root, into the graded
    copy; a FIFO swapped in was read (and, with no writer, blocked the copy forever). Now it opens
    relative to descriptors of the folders it checked, with O_NOFOLLOW|O_NONBLOCK, and copies only
    what fstat of that descriptor shows is a regular file."""
    from workbench.sandbox import copy_tree

    host = base / "host"
    host.mkdir(mode=0o700)
    (host / "secret").write_text("HOST SECRET")
    ws = base / "ws"
    (ws / "sub").mkdir(parents=True)
    payload = b"FROM A FIFO"
    (ws / "data").write_bytes(b"x" * len(payload))
    (ws / "sub" / "secret").write_text("agent's own")
    fifo_fds: list[int] = []

    def swap_file_for_link():
        (ws / "data").unlink()
        (ws / "data").symlink_to(host / "secret")

    def swap_file_for_fifo():
        (ws / "data").unlink()
        os.mkfifo(ws / "data")
        fd = os.open(ws / "data", os.O_RDWR | os.O_NONBLOCK)  # a writer, so the open does not block
        os.write(fd, payload)
        fifo_fds.append(fd)

    def swap_folder_for_link():
        (ws / "sub").rename(ws / "sub.moved")
        (ws / "sub").symlink_to(host)

    name, action = {
        "file-for-link": ("data", swap_file_for_link),
        "file-for-fifo": ("data", swap_file_for_fifo),
        "folder-for-link": ("sub", swap_folder_for_link),
    }[swap]
    fired = _swap_after_lstat(monkeypatch, name, action)
    try:
        copy_tree(ws, base / "copy")
    finally:
        for fd in fifo_fds:
            os.close(fd)
    assert fired
    copied = b"".join(
        (Path(top) / f).read_bytes()
        for top, _, files in os.walk(base / "copy")
        for f in files
        if (Path(top) / f).is_file() and not (Path(top) / f).is_symlink()
    )
    assert b"HOST SECRET" not in copied and payload not in copied


# ------------------------------------------------------------------- the grading copy's total writes


def _allocated(root: Path) -> int:
    """Bytes allocated under `root` (st_blocks: what the host's disk lost), files vanishing meanwhile skipped."""
    total = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


@pytest.mark.parametrize("mode", MODES)
def test_grading_writes_are_bounded_in_total(base, mode):
    """A solution that passes its first test, then writes 2 GiB in 16 MiB files (each under
    RLIMIT_FSIZE) into its grading copy: once, the host's disk lost all 2 GiB while the test ran and
    the rollout scored 1.0. Now the copy is measured while the test runs: the writer is killed near
    the budget, the verification scores 0 with the reason, and the copy is gone."""
    budget_mb = 64
    task = Task(
        id="t/add",
        instruction="",
        files={},
        visible_tests="",
        test_kind="function_call",
        entry_point="add",
        held_out_tests=[{"input": [1, 2], "output": [3]}, {"input": [2, 2], "output": [4]}],
        limits=Limits(time_s=20.0, deadline_s=60.0, file_mb=16, workspace_mb=16, disk_mb=budget_mb),
    )
    flood = (
        "import os\ndef add(a, b):\n    if a == 2:\n        chunk = bytes(1 << 20)\n"
        "        for i in range(128):\n            with open(f'fill_{i}', 'wb') as f:\n"
        "                for _ in range(16):\n                    f.write(chunk)\n    return a + b\n"
    )
    ws = _workspace(base, {"solution.py": flood})
    before, peak, done = _allocated(base), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _allocated(base))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    t0 = time.monotonic()
    try:
        result = verify(task, ws, sandbox=mode)
    finally:
        done.set()
        sampler.join()
    grew_mib = (peak[0] - before) / 2**20
    # A writer at ~1.2 GiB/s on this 2-core host got 1-19 MiB past the budget before the poll killed it,
    # up to 49 MiB with two busy loops beside (benchmarks/grading_budget.py [--hogs 2]); the slack is for a
    # busier host (the grader waits for the CPU while the writer writes). The old grader let all 2 GiB through.
    assert grew_mib < budget_mb + 192, f"the host folder grew by {grew_mib:.0f} MiB"
    assert result.reward == 0.0 and result.passed == 0, result.table()
    assert [t.outcome for t in result.tests] == ["crash", "crash"], result.table()
    assert all(f"the grading copy exceeded {budget_mb} MiB during test 1" in t.reason for t in result.tests)
    assert result.error is None and time.monotonic() - t0 < 30, f"{time.monotonic() - t0:.1f} s"
    assert list(base.glob("wb-verify-*")) == [] and _allocated(base) <= before, list(base.rglob("*"))[:5]


@pytest.mark.parametrize("mode", MODES)
def test_grading_entries_are_bounded_in_total(base, mode):
    """Empty files cost inodes, not bytes: 3,000 of them (one test of stdin_stdout) pass a 500-entry
    budget; the rest of the verification is not run, and it scores 0."""
    task = Task(
        id="t/echo",
        instruction="",
        files={},
        visible_tests="",
        test_kind="stdin_stdout",
        entry_point=None,
        held_out_tests=[{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "2\n"}],
        limits=Limits(time_s=20.0, deadline_s=60.0, workspace_entries=100, disk_entries=500),
    )
    many = "import os\nfor i in range(3000):\n    open(f'e_{i}', 'w').close()\nprint(input())\n"
    result = verify(task, _workspace(base, {"solution.py": many}), sandbox=mode)
    assert result.reward == 0.0 and [t.outcome for t in result.tests] == ["crash", "crash"], result.table()
    assert all("the grading copy exceeded 500 files and folders during test 0" in t.reason for t in result.tests)
    assert list(base.glob("wb-verify-*")) == []


def test_a_harness_report_is_read_without_following_links(tmp_path):
    """`Launch.report` names a file the agent's uid wrote: read as root, it must never follow a link (at any step)
    to a host file, block on a FIFO, or leave HOME."""
    from workbench.sandbox.bounded_copy import read_bounded

    home = tmp_path / "home"
    (home / ".tool").mkdir(parents=True)
    (home / ".tool" / "usage.json").write_text('{"api_calls": 2}')
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    os.symlink(secret, home / ".tool" / "linked.json")
    os.symlink(tmp_path, home / ".via")
    os.mkfifo(home / ".tool" / "fifo")
    assert read_bounded(home, ".tool/usage.json", 1 << 20) == b'{"api_calls": 2}'
    assert read_bounded(home, ".tool/usage.json", 5) == b'{"api'  # bounded
    for rel in (
        ".tool/linked.json",
        ".via/secret.txt",
        ".tool/fifo",
        "../secret.txt",
        "/etc/passwd",
        ".tool",
        "no/such",
    ):
        assert read_bounded(home, rel, 1 << 20) is None, rel
