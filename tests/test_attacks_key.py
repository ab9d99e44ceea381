"""The agent's own model calls, with the rollout's key: refused, never recorded, counted.

The harness's tools inherit its environment, and opencode's config (with the rollout's key and the
proxy's URL) is in it: a shell command can call the model itself, and the proxy would record that call
as the harness's, to be trained. Under bubblewrap only the harness's own process reaches the proxy
(`_sandbox_init` checks each connection's owner, `sandbox_net` relays only the forwarder's); plain mode
shares the host's network and cannot tell the two apart (docs/sandboxes.md). Here the real opencode,
driven by a scripted engine, runs the attack with its bash tool; the mechanism alone is checked with
plain processes in a sandbox.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from isolations import HARNESS_ISOLATIONS
from scripted_upstream import ScriptedUpstream
from workbench.sandbox import _init as _sandbox_init, net as sandbox_net, Sandbox, bwrap_available
from workbench.capture import CaptureProxy
from workbench.rollout import run_rollout, RolloutConfig
from workbench.sandbox.command import SOCKET_INSIDE
from workbench.tasks import load_task

BWRAP = pytest.mark.skipif(not bwrap_available(), reason="bwrap is not installed (scripts/setup.sh installs it)")
MARK = "STOLEN-CALL-7f3a"  # the agent's own request carries it: it must reach neither the engine nor the trace

# What the agent's bash tool runs: the key and URL from opencode's config in its environment, one chat
# completion through 127.0.0.1:PORT (as the harness calls) and one straight into the relay's socket.
ATTACK = f"""python - <<'EOF'
import json, os, socket, urllib.request
opts = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])["provider"]["wb"]["options"]
body = json.dumps({{"model": "scripted", "messages": [{{"role": "user", "content": "{MARK}"}}], "max_tokens": 4}}).encode()
head = {{"Authorization": "Bearer " + opts["apiKey"], "Content-Type": "application/json"}}
try:
    r = urllib.request.urlopen(urllib.request.Request(opts["baseURL"] + "/chat/completions", body, head), timeout=10)
    print("tcp answered", r.status)
except Exception as e:
    print("tcp refused", type(e).__name__)
if os.path.exists("{SOCKET_INSIDE}"):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect("{SOCKET_INSIDE}")
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nhost: x\\r\\nauthorization: Bearer " + opts["apiKey"].encode()
                  + b"\\r\\ncontent-type: application/json\\r\\nconnection: close\\r\\ncontent-length: "
                  + str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
        got = s.recv(12)
    except OSError as e:
        got = type(e).__name__.encode()
    print("unix answered", got)
EOF"""


def _asked(request: dict) -> bool:
    """Whether `request` is the agent's own: MARK as a message of its own."""
    return any(m.get("content") == MARK for m in request.get("messages") or [])


def _tool_output(request: dict) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"] if m["role"] == "tool")


@pytest.mark.parametrize("isolation", HARNESS_ISOLATIONS)
def test_the_agents_own_model_calls_are_refused_and_counted(base, isolation, request):
    up = ScriptedUpstream().start()
    up.untooled = "text"
    up.script = [f"bash:{ATTACK}", "wait:90"]  # the last answer waits for opencode's title call
    up.release_after_an_untooled_request()
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            result = run_rollout(
                load_task("easy/0"), proxy.client(), RolloutConfig(timeout_s=120, isolation=isolation), base / "r0"
            )
    finally:
        up.stop()
    summary = result.summary
    trace = json.loads((base / "r0" / "trace.json").read_text())
    said = _tool_output([r for r in up.requests if r.get("tools")][-1])  # the title call may come last
    if isolation == "none":  # nothing stands between the agent and the proxy's port: recorded as unchecked
        assert summary["refused_model_connections"] is None, summary
        request.applymarker(pytest.mark.xfail(strict=True, reason="plain mode: the agent reaches the proxy itself"))
    assert "tcp " in said, said  # the attack ran
    # (the harness's later requests quote the command, MARK included, in the assistant's tool call)
    assert not any(_asked(r) for r in up.requests), said
    assert not any(_asked(c["request"]) for c in trace), said
    # the harness's own calls went through: its title call and both agent steps, all recorded
    assert summary["status"] == "ok" and summary["calls_by_purpose"] == {"title": 1, "agent": 2}, summary
    # both closed unanswered: no HTTP reply came back either way
    assert "tcp refused" in said and "unix answered" in said and "unix answered b'HTTP" not in said, said
    assert summary["refused_model_connections"] == 2, summary


# ------------------------------------------------------------------------------------- the mechanism


class _Endpoint:
    """A TCP endpoint on the host that answers each connection "ok" and counts them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
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
            conn.sendall(b"ok")
            conn.close()


# Inside the sandbox: this process connects first (pinned, as the harness is), then a child of it,
# then a direct connection to the relay's socket, then this process again.
PROBE = """import socket, subprocess, sys
port = int(sys.argv[1])
def tcp():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            return s.recv(2).decode() or "closed"
    except OSError as e:
        return type(e).__name__
def unix():
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(sys.argv[2])
        return s.recv(2).decode() or "closed"
if sys.argv[3:] == ["child"]:
    print(tcp())
else:
    first = tcp()
    child = subprocess.run([sys.executable, __file__, *sys.argv[1:3], "child"], capture_output=True, text=True).stdout.strip()
    print(first, child, unix(), tcp())
"""


@BWRAP
def test_only_the_first_process_to_connect_reaches_the_endpoint(base):
    endpoint = _Endpoint()
    url = f"http://127.0.0.1:{endpoint.port}"
    with Sandbox.create({"probe.py": PROBE}, isolation="bwrap", base_dir=base, endpoint=url, git_init=False) as sb:
        port = sb.reach(url).rsplit(":", 1)[1]
        code, out = sb.run(["python", "probe.py", port, SOCKET_INSIDE], timeout_s=60)
        refused = sb.refused_connections
        # a second command in the same sandbox: its forwarder is not the relay's, and says so
        _, again = sb.run(["python", "probe.py", port, SOCKET_INSIDE], timeout_s=60)
    assert code == 0 and out.split()[-4:] == ["ok", "closed", "closed", "ok"], out
    assert endpoint.hits == 2 and refused == 2
    assert "did not take this process as the sandbox's forwarder" in again and again.split()[-4:] == ["closed"] * 4
    assert endpoint.hits == 2
    endpoint.sock.close()


def test_the_forwarder_and_the_relay_speak_alike():
    assert (_sandbox_init.ACK, _sandbox_init.REFUSED) == (sandbox_net.ACK, sandbox_net.REFUSED)
