"""Harbor task folders, their grading, verifier hooks, and long rollouts through the real opencode.

A small Harbor task is written into tmp_path per test (task.toml, instruction.md, a Dockerfile copying
app/ into /app, tests/test.sh, solution/solve.sh); the shipped repository tasks are checked with their
oracles. Grading under bubblewrap (Harbor's paths need it): the bwrap tests are skipped without it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from scripted_upstream import ScriptedUpstream
from workbench.capture import CaptureProxy
from workbench.tasks.harbor import REPO_TASKS, HarborError, load_harbor_task
from workbench.rollout import run_rollout, RolloutConfig
from workbench.sandbox import Sandbox
from workbench.tasks import Limits, Task, load_task, load_tasks
from workbench.verify import sandbox_guards, verify
from workbench.verify.oracle import oracle_check

pytestmark = pytest.mark.skipif("bwrap" not in sandbox_guards(), reason="Harbor grading needs bubblewrap")

SECRET = "held-out-marker-7f3a"  # in the tests only: must never be readable from the agent's sandbox
PASS_IF_FIXED = f"""#!/bin/bash
# {SECRET}
cd /app
if python -c "import greet, sys; sys.exit(greet.greet() != 'hello')"; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def harbor_task(
    root: Path,
    test_sh: str = PASS_IF_FIXED,
    toml_extra: str = "",
    dockerfile: str | None = None,
    extra_tests: dict[str, str] | None = None,
) -> Path:
    """A Harbor task folder: greet() returns "bye", the task asks for "hello"."""
    files = {
        "task.toml": 'version = "1.0"\n[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 120.0\n'
        "[environment]\ncpus = 1\nmemory_mb = 2048\n" + toml_extra,
        "instruction.md": "Make greet() in greet.py return 'hello'.\n",
        "environment/Dockerfile": dockerfile or "FROM python:3.11-slim\nWORKDIR /app\nCOPY app/ /app/\n",
        "environment/app/greet.py": 'def greet():\n    return "bye"\n',
        "tests/test.sh": test_sh,
        "solution/solve.sh": "#!/bin/bash\nprintf 'def greet():\\n    return \"hello\"\\n' > /app/greet.py\n",
        **(extra_tests or {}),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def load(root: Path, **kwargs) -> Task:
    return load_task(f"harbor:{harbor_task(root, **kwargs)}")


def script(body: str) -> str:
    return "#!/bin/bash\n" + body + "\n"


def start(task, root: Path) -> Path:
    for rel, text in task.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# ------------------------------------------------------------------------------------------ loading


def test_task_folder_becomes_a_task(tmp_path):
    task = load_task(f"harbor:{harbor_task(tmp_path / 't')}")
    assert task.id == f"harbor:{tmp_path / 't'}" and load_task(task.id) == task
    assert task.test_kind == "harbor" and task.files == {"greet.py": 'def greet():\n    return "bye"\n'}
    assert task.limits.time_s == 20.0 and task.agent_timeout_s == 120.0 and task.limits.memory_mb == 2048
    assert set(task.held_out_tests[0]["tests"]) == {"test.sh"} and "solve.sh" in task.held_out_tests[0]["solution"]
    assert SECRET not in json.dumps(task.public_json()) and SECRET not in json.dumps(task.files)
    harbor_task(tmp_path / "many" / "b"), harbor_task(tmp_path / "many" / "a")
    assert [t.id.rsplit("/", 1)[1] for t in load_tasks(f"harbor:{tmp_path / 'many'}")] == ["a", "b"]
    assert len(load_tasks(f"harbor:{tmp_path / 'many'}[1:]")) == 1
    with pytest.raises(ValueError, match="holds 2 of them"):
        load_task(f"harbor:{tmp_path / 'many'}")


@pytest.mark.parametrize(
    ("toml_extra", "dockerfile", "test_sh", "named"),
    [
        ("gpus = 1\n", None, PASS_IF_FIXED, "environment.gpus"),
        ("allow_internet = true\n", None, PASS_IF_FIXED, "environment.allow_internet"),
        ('docker_image = "ubuntu:24.04"\n', None, PASS_IF_FIXED, "environment.docker_image"),
        ("shiny = 3\n", None, PASS_IF_FIXED, "environment.shiny"),
        (
            "",
            "FROM x\nWORKDIR /app\nRUN apt-get update && apt-get install -y no-such-package-zz\n",
            PASS_IF_FIXED,
            "Dockerfile line 3: apt-get install no-such-package-zz",
        ),
        (
            "",
            "FROM x\nWORKDIR /app\nRUN pip install no-such-dist-zz==1.0\n",
            PASS_IF_FIXED,
            "pip install no-such-dist-zz",
        ),
        ("", "FROM x\nWORKDIR /app\nRUN make build\n", PASS_IF_FIXED, "build steps are not run"),
        ("", "FROM x\nWORKDIR /workspace\n", PASS_IF_FIXED, "WORKDIR /workspace"),
        ("", "FROM a AS b\nFROM b\nWORKDIR /app\n", PASS_IF_FIXED, "multi-stage"),
        ("", None, script("curl -LsSf https://astral.sh/uv/install.sh | sh"), "tests/test.sh line 2"),
    ],
)
def test_what_needs_a_container_is_refused_naming_the_field(tmp_path, toml_extra, dockerfile, test_sh, named):
    with pytest.raises(HarborError, match=named.replace(".", r"\.")):
        load_harbor_task(harbor_task(tmp_path, test_sh, toml_extra, dockerfile))


def test_installs_the_host_already_has_are_accepted(tmp_path):
    dockerfile = (
        "FROM python:3.11-slim\nENV PYTHONUNBUFFERED=1\nRUN apt-get update && apt-get install -y bash \\\n"
        "    && rm -rf /var/lib/apt/lists/*\nRUN pip install setuptools\nWORKDIR /app\nCOPY app/greet.py .\n"
        'CMD ["sleep", "infinity"]\n'
    )
    assert load_harbor_task(harbor_task(tmp_path, dockerfile=dockerfile)).files == {
        "greet.py": 'def greet():\n    return "bye"\n'
    }


def test_binary_files_are_refused_only_when_copied(tmp_path):
    root = harbor_task(tmp_path / "t", dockerfile="FROM x\nWORKDIR /app\nCOPY app/greet.py .\n")
    (root / "environment" / "app" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    assert set(load_harbor_task(root).files) == {"greet.py"}
    (root / "environment" / "Dockerfile").write_text("FROM x\nWORKDIR /app\nCOPY app/ /app/\n")
    with pytest.raises(HarborError, match="environment/app/logo.png: not UTF-8 text"):
        load_harbor_task(root)


def test_bytecode_caches_are_no_task_files(tmp_path):
    """Running a task's code by hand leaves __pycache__/*.pyc beside it (binary): ignored, never refused."""
    root = harbor_task(tmp_path / "t", dockerfile="FROM x\nWORKDIR /app\nCOPY app/ /app/\n")
    for folder in (root / "environment" / "app", root / "tests"):
        (folder / "__pycache__").mkdir()
        (folder / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\xa7\r\r\n\x00\xff")
    task = load_harbor_task(root)
    assert set(task.files) == {"greet.py"}
    assert not any("__pycache__" in name for name in task.held_out_tests[0]["tests"])


# ------------------------------------------------------------------------------------------ grading


def test_oracle_scores_one_and_the_start_zero(tmp_path):
    report = oracle_check(load_task(f"harbor:{harbor_task(tmp_path / 't')}"))
    assert (report["oracle"], report["start"], report["solve"]) == (1.0, 0.0, "ok"), report


@pytest.mark.parametrize(
    ("body", "outcome", "reason"),
    [
        ("exit 0", "error", "wrote neither /logs/verifier/reward.txt nor reward.json"),
        ("echo 1.5 > /logs/verifier/reward.txt", "error", "reward 1.5 is outside [0, 1]: refused"),
        ("echo -0.5 > /logs/verifier/reward.txt", "error", "outside [0, 1]"),
        ("echo nan > /logs/verifier/reward.txt", "error", "not a finite number"),
        ("echo lots > /logs/verifier/reward.txt", "error", "not a number"),
        ("ln -s /etc/passwd /logs/verifier/reward.txt", "error", "cannot be read"),
        ("while true; do :; done", "timeout", "no result within 2 s"),
        ("sleep 300 & echo 1 > /logs/verifier/reward.txt; exec sleep 300", "timeout", "no result"),
    ],
)
def test_a_test_sh_without_a_usable_reward_scores_zero_and_says_why(tmp_path, body, outcome, reason):
    task = load(tmp_path / "t", test_sh=script(body))
    task = replace(task, limits=replace(task.limits, time_s=2.0))
    result = verify(task, start(task, tmp_path / "ws"))
    assert (result.reward, result.tests[0].outcome) == (0.0, outcome), result.table()
    assert reason in result.tests[0].reason


def test_reward_json_keeps_metrics_and_partial_rewards(tmp_path):
    body = 'echo \'{"reward": 0.25, "tests_passed": 1, "tests_total": 4, "note": "text is dropped"}\' > /logs/verifier/reward.json'
    task = load(tmp_path / "t", test_sh=script(body))
    result = verify(task, start(task, tmp_path / "ws"))
    assert (result.reward, result.passed, result.tests[0].outcome) == (0.25, 0, "wrong")
    assert result.tests[0].metrics == {"tests_passed": 1.0, "tests_total": 4.0}


def test_test_sh_sees_harbor_paths_and_nothing_of_ours(tmp_path):
    """/app is the copy (writable, the cwd), /tests read-only, /logs/verifier writable, python has pytest;
    the project, the run folders and the original workspace are not there; no network."""
    checks = [
        '[ "$PWD" = /app ]',
        "[ -f /app/greet.py ]",
        "touch /app/new",
        "! touch /tests/x",
        "[ -f /tests/helper.txt ]",
        "python -c 'import pytest'",
        f"[ ! -e {Path(__file__).resolve().parents[1] / 'workbench' / 'data'} ]",
        f"[ ! -e {tmp_path / 'ws'} ]",
        "! python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'",
    ]
    body = 'fail() { echo 0 > /logs/verifier/reward.txt; echo "check $1 failed"; exit 0; }\n'
    body += "\n".join(f"{c} || fail {n}" for n, c in enumerate(checks))
    task = load(
        tmp_path / "t",
        test_sh=script(body + "\necho 1 > /logs/verifier/reward.txt"),
        extra_tests={"tests/helper.txt": "x"},
    )
    result = verify(task, start(task, tmp_path / "ws"))
    assert result.reward == 1.0, result.table()


def test_plain_mode_refuses_harbor_grading(tmp_path):
    task = load_task(f"harbor:{harbor_task(tmp_path / 't')}")
    with pytest.raises(RuntimeError, match="needs bubblewrap"):
        verify(task, start(task, tmp_path / "ws"), sandbox="none")


def test_held_out_tests_are_not_in_the_agents_sandbox(tmp_path):
    task = load_task(f"harbor:{harbor_task(tmp_path / 't')}")
    with Sandbox.create(task.files, isolation="bwrap", base_dir=Path(tempfile.gettempdir())) as sb:
        code, out = sb.run(
            [
                "bash",
                "-c",
                f"ls /tests /solution /logs 2>&1; ls -a /app; [ -e {tmp_path} ] && echo VISIBLE; "
                f"grep -rl {SECRET} /app /home/agent /tmp 2>/dev/null; echo done",
            ],
            timeout_s=30,
        )
    assert "greet.py" in out and "done" in out, out
    assert out.count("No such file or directory") == 3 and "VISIBLE" not in out and SECRET not in out, out


def test_shipped_repository_tasks_oracle_one_start_zero():
    tasks = load_tasks("repo-tasks")
    assert [t.id for t in tasks] == [f"repo-tasks/{p.name}" for p in sorted(REPO_TASKS.iterdir()) if p.is_dir()]
    assert len(tasks) >= 3 and all(len(t.files) >= 4 for t in tasks)
    for task in tasks:
        report = oracle_check(task)
        assert (report["oracle"], report["start"]) == (1.0, 0.0), report


# ------------------------------------------------------------------------------------------ hooks

HOOKS = """
import os
from pathlib import Path


def score(workspace, task):
    text = (Path(workspace) / "greet.py").read_text()
    return {"reward": 1.0 if "hello" in text else 0.0, "chars": len(text), "cwd_is_app": float(os.getcwd() == "/app"),
            "data_visible": float(os.path.exists(DATA)), "tests": len(task.held_out_tests), "why": "dropped"}


def half(workspace, task):
    return 0.5


def boom(workspace, task):
    raise RuntimeError("the hook broke")


def spin(workspace, task):
    while True:
        pass


def too_big(workspace, task):
    return 2


def leaves(workspace, task):
    os._exit(0)
"""


@pytest.fixture
def hooks(tmp_path) -> Path:
    path = tmp_path / "my_hooks.py"
    data = Path(__file__).resolve().parents[1] / "workbench" / "data" / "easy_tasks.jsonl"
    path.write_text(f"DATA = {str(data)!r}\n{HOOKS}")
    return path


def test_a_hook_scores_the_workspace_in_the_jail(tmp_path, hooks):
    task = load_task("easy/0")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "greet.py").write_text("def greet(): return 'hello'\n")
    result = verify(task, ws, verifier=f"{hooks}:score")
    assert (result.reward, result.total, result.tests[0].outcome) == (1.0, 1, "passed"), result.table()
    # in the jail at /app, the task whole (held-out tests included), the package's data masked
    assert result.tests[0].metrics == {
        "chars": 28.0,
        "cwd_is_app": 1.0,
        "data_visible": 0.0,
        "tests": float(len(task.held_out_tests)),
    }
    (ws / "greet.py").write_text("def greet(): return 'bye'\n")
    assert verify(task, ws, verifier=f"{hooks}:score").reward == 0.0
    assert verify(task, ws, verifier=f"{hooks}:half").reward == 0.5
    assert verify(replace(task, verifier=f"{hooks}:half"), ws).reward == 0.5  # per task


@pytest.mark.parametrize(
    ("function", "outcome", "reason"),
    [
        ("boom", "error", "RuntimeError: the hook broke"),
        ("spin", "timeout", "no result within 2 s"),
        ("too_big", "error", "outside [0, 1]: refused"),
        ("leaves", "error", "exited without an answer"),
        ("missing", "error", "has no function 'missing'"),
    ],
)
def test_a_failing_hook_is_an_outcome_not_a_crash_of_the_grader(tmp_path, hooks, function, outcome, reason):
    task = replace(load_task("easy/0"), limits=Limits(time_s=2.0, deadline_s=30.0))
    (tmp_path / "ws").mkdir()
    result = verify(task, tmp_path / "ws", verifier=f"{hooks}:{function}")
    assert (result.reward, result.tests[0].outcome) == (0.0, outcome), result.table()
    assert reason in result.tests[0].reason


def test_a_harbor_task_names_its_hook_in_task_toml(tmp_path, hooks):
    (tmp_path / "t" / "tests").mkdir(parents=True)
    (tmp_path / "t" / "tests" / "hooks.py").write_text(hooks.read_text())
    task = load(tmp_path / "t", toml_extra='[metadata.workbench]\nverifier = "tests/hooks.py:score"\n')
    assert task.verifier == f"{tmp_path / 't' / 'tests' / 'hooks.py'}:score"
    assert verify(task, start(task, tmp_path / "ws")).reward == 0.0
    (tmp_path / "ws" / "greet.py").write_text("def greet(): return 'hello'\n")
    assert verify(task, tmp_path / "ws").reward == 1.0


def test_bad_hook_specs_are_refused(tmp_path):
    for spec, match in [
        ("nocolon", "expected"),
        ("no_such_module_zz:f", "no module"),
        (f"{tmp_path}/x.py:f", "no Python file"),
    ]:
        with pytest.raises(ValueError, match=match):
            verify(load_task("easy/0"), tmp_path, verifier=spec)


# ------------------------------------------------------------------------------------------ rollouts


def _bash(command: str) -> str:
    return f"bash:{command}"


@pytest.mark.opencode
def test_real_opencode_solves_a_repository_task_in_many_turns(tmp_path):
    """The real opencode, in its bwrap sandbox, driven by a scripted upstream (a test double: its token
    ids are random) through a long tool-using conversation on inventory-fix: it reads, runs the visible
    tests, rewrites two modules, runs them again; Harbor's grading then gives 1.0."""
    task = load_task("repo-tasks/inventory-fix")
    fixed = task.held_out_tests[0]["solution"]
    rewrite = "".join(
        f"cat > {rel[len('files/') :]} <<'EOF'\n{text}EOF\n" for rel, text in fixed.items() if rel.startswith("files/")
    )
    up = ScriptedUpstream().start()
    up.untooled = "text"  # opencode's title call
    up.script = [
        _bash("ls -R"),
        _bash("cat inventory/store.py inventory/report.py"),
        _bash("cat test_inventory.py"),
        _bash("python -m unittest 2>&1 | tail -3"),
        _bash(rewrite),
        _bash("python -m unittest 2>&1 | tail -3"),
        "text",
    ]
    try:
        with CaptureProxy(up.url, "scripted") as proxy:
            result = run_rollout(
                task,
                proxy.client(),
                RolloutConfig(timeout_s=180, max_output_tokens=64, isolation="bwrap"),
                tmp_path / "r",
            )
    finally:
        up.stop()
    summary = result.summary
    assert (summary["status"], summary["reward"]) == ("ok", 1.0), summary
    assert summary["agent_turns"] == 7 and summary["tool_calls"] == {"bash": 6}
    outputs = [m for body in up.requests for m in body.get("messages", []) if m.get("role") == "tool"]
    assert "FAILED" in json.dumps(outputs) and "OK" in json.dumps(outputs)  # the agent saw both test runs
    verified = json.loads((tmp_path / "r" / "verify.json").read_text())
    assert verified["tests"][0]["metrics"] == {"tests_passed": 12.0, "tests_total": 12.0}
    assert not any(
        SECRET in p.read_text(errors="ignore") for p in (tmp_path / "r" / "workspace").rglob("*") if p.is_file()
    )
    assert os.stat(tmp_path / "r" / "held_out_tests.json").st_mode & 0o777 == 0o600


@pytest.mark.engine
@pytest.mark.opencode
def test_tiny_model_rollout_on_a_repository_task(engine, tmp_path):
    """The real engine (the tiny random model) through opencode on a Harbor task: captured, graded 0."""
    with CaptureProxy(engine.url, engine.served_name, upstream_api_key=engine.api_key) as proxy:
        result = run_rollout(
            load_task("repo-tasks/textkit-top-words"),
            proxy.client(),
            RolloutConfig(temperature=0.8, max_output_tokens=32, timeout_s=240, isolation="bwrap"),
            tmp_path / "r",
        )
    summary = result.summary
    assert summary["status"] in ("ok", "harness_error"), summary
    assert summary["reward"] == 0.0 and summary["tests_total"] == 1 and summary["agent_turns"] >= 1
    calls = json.loads((tmp_path / "r" / "trace.json").read_text())
    agent = [c for c in calls if c["purpose"] == "agent" and c["status"] == "ok"]
    assert agent and all(len(c["completion_token_ids"]) == len(c["per_token_logps"]) > 0 for c in agent)
    # the instruction reached the model; the workspace held the package's files
    assert "top_words" in json.dumps(agent[0]["request"]["messages"])
    assert (tmp_path / "r" / "workspace" / "textkit" / "stats.py").exists()


def test_shipped_long_capture_chains_into_one_row():
    """The teacher-forced 7-turn capture on inventory-fix (real ids, scripted replies: its CAPTURE.md)."""
    from transformers import AutoTokenizer

    from workbench.turns import analyse, load_trace

    folder = Path(__file__).resolve().parents[1] / "workbench" / "data" / "rollouts" / "smollm2-forced-repo-task"
    tok = AutoTokenizer.from_pretrained(folder.parent / "smollm2-tokenizer")
    report = analyse(load_trace(folder / "trace.json"), tok).report
    assert (report["turns"], report["rows"], report["forks"]) == (7, 1, 0), report
    assert report["tokens_in_rows"] == 5622 and report["tokens_per_turn_rows"] == 31221
    assert json.loads((folder / "summary.json").read_text())["reward"] == 1.0


def test_harbor_check_command_reports_oracle_and_start_per_task():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "workbench", "harbor", "check", "repo-tasks/inventory-fix"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    [report] = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert (report["oracle"], report["start"]) == (1.0, 0.0)


def test_train_rewards_every_task_with_the_given_verifier(tmp_path):
    from workbench.train import GRPORun, TrainConfig

    run = GRPORun(TrainConfig(tasks="easy-train[:3]", verifier="pkg.mod:score"), run_dir=tmp_path / "r")
    assert [t.verifier for t in run.tasks] == ["pkg.mod:score"] * 3
    assert all(t.verifier is None for t in GRPORun(TrainConfig(tasks="easy-train[:3]"), run_dir=tmp_path / "s").tasks)
