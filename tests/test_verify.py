"""Verification: real solutions graded in real sandboxed processes, hostile ones contained and reported.

Hostile solutions run with and without bubblewrap (the bwrap variant is skipped where `bwrap` is missing);
after each, no process they started may survive and no file they wrote may remain.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import tempfile
import uuid
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from workbench import cli
from workbench.tasks import Limits, Task, humaneval_path, load_task, load_tasks
from workbench.verify import Shaping, VerifyResult, sandbox_guards, shaped_reward, verify, verify_many

BWRAP = pytest.param(
    "bwrap",
    marks=pytest.mark.skipif(
        "bwrap" not in sandbox_guards(), reason="bwrap is not installed or cannot create namespaces"
    ),
)
SANDBOXES = ["none", BWRAP]
FAST = Limits(time_s=1.0, deadline_s=30.0)


@pytest.fixture(scope="module")
def humaneval_rows() -> list[dict]:
    with gzip.open(humaneval_path(), "rt") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def fixture_tasks() -> list[Task]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fixture's deliberately unusable row
        return load_tasks("deepcoder-fixture")


def workspace(path: Path, code: str | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if code is not None:
        (path / "solution.py").write_text(code)
    return path


def stdin_task(output: str = "3\n", limits: Limits = FAST) -> Task:
    return Task(
        id="t/stdin",
        instruction="",
        files={},
        visible_tests="",
        test_kind="stdin_stdout",
        held_out_tests=[{"input": "1 2\n", "output": output}],
        entry_point=None,
        limits=limits,
    )


# ------------------------------------------------------------------------------------------- HumanEval


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_all_humaneval_canonical_solutions_pass(tmp_path, humaneval_rows, sandbox):
    tasks = load_tasks("humaneval")
    items = [
        (task, workspace(tmp_path / str(i), row["prompt"] + row["canonical_solution"]))
        for i, (task, row) in enumerate(zip(tasks, humaneval_rows, strict=True))
    ]
    results = verify_many(items, progress=False, sandbox=sandbox)
    assert [r.task_id for r in results] == [t.id for t in tasks]
    failed = {r.task_id: r.tests[0].reason for r in results if r.reward != 1.0}
    assert failed == {}
    assert all(r.passed == r.total == 1 for r in results)


@pytest.mark.parametrize(
    "code, outcome, reason",
    [
        ("", "crash", "solution.py defines no function 'has_close_elements'"),
        ("def has_close_elements(numbers, threshold)\n    return False\n", "crash", "SyntaxError"),
        (
            "def has_close_elements(numbers, threshold):\n    return False\n",
            "wrong",
            "assertion failed: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True",
        ),
        (
            "def has_close_elements(numbers, threshold):\n    return 1 / 0\n",
            "crash",
            "ZeroDivisionError: division by zero (solution.py line 2)",
        ),
        ("def has_close_elements(numbers, threshold):\n    return None\n", "wrong", "assertion failed"),
        (None, "missing_file", "there is no solution.py"),
    ],
)
def test_humaneval_failures_score_zero_with_reasons(tmp_path, code, outcome, reason):
    result = verify(load_task("humaneval/0"), workspace(tmp_path / "ws", code))
    assert (result.reward, result.passed, result.total) == (0.0, 0, 1)
    assert result.tests[0].outcome == outcome
    assert reason in result.tests[0].reason


def test_an_object_that_equals_everything_does_not_pass(tmp_path):
    code = (
        "class Anything:\n    def __eq__(self, other):\n        return True\n\n"
        "def has_close_elements(numbers, threshold):\n    return Anything()\n"
    )
    result = verify(load_task("humaneval/0"), workspace(tmp_path / "ws", code))
    assert result.tests[0].outcome == "crash" and "cannot be compared" in result.tests[0].reason


# ------------------------------------------------------------------------------------ DeepCoder fixture


def test_stdin_stdout_full_and_partial_credit(tmp_path, fixture_tasks):
    sum_task = fixture_tasks[0]  # six tests: 1 2 | -5 5 | 1e9 1e9 | -7 -8 | 0 0 | 123 -23
    right = verify(sum_task, workspace(tmp_path / "a", "a, b = map(int, input().split())\nprint(a + b)\n"))
    assert (right.reward, right.passed, right.total) == (1.0, 6, 6)
    half_right = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)\n"
    half = verify(sum_task, workspace(tmp_path / "b", half_right))
    assert (half.reward, half.passed, half.total) == (0.5, 3, 6)
    assert [t.outcome for t in half.tests] == ["passed", "wrong", "passed", "wrong", "wrong", "passed"]
    assert half.tests[1].reason == "expected '0', got '1'"


def test_stdin_stdout_output_normalisation(tmp_path, fixture_tasks):
    totals = fixture_tasks[4]  # running totals, one per line
    crlf = (
        "n = int(input())\ns = 0\nfor x in input().split():\n    s += int(x)\n    print(s, end='  \\r\\n')\nprint()\n"
    )
    assert verify(totals, workspace(tmp_path / "a", crlf)).reward == 1.0
    one_line = "n = int(input())\nimport itertools\nprint(*itertools.accumulate(map(int, input().split())))\n"
    assert verify(totals, workspace(tmp_path / "b", one_line)).reward == 1.0  # same tokens
    crash = verify(totals, workspace(tmp_path / "c", "print(1)\nraise ValueError('nope')\n"))
    assert crash.tests[0].outcome == "crash" and crash.tests[0].reason == "ValueError: nope"
    silent = verify(totals, workspace(tmp_path / "d", "pass\n"))
    assert silent.tests[0].reason == "expected '1\\n3\\n6', got no output"


def test_function_call_full_and_partial_credit(tmp_path, fixture_tasks):
    vowels, divisors = fixture_tasks[2], fixture_tasks[3]
    right = "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n"
    assert verify(vowels, workspace(tmp_path / "a", right)).reward == 1.0
    lower = "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n"
    result = verify(vowels, workspace(tmp_path / "b", lower))  # wrong on "Education" and "AEIOUaeiou"
    assert (result.passed, result.total) == (4, 6) and result.reward == pytest.approx(4 / 6)
    assert result.tests[2].reason == "returned 4, expected 5"
    as_tuple = "def divisors(n):\n    return tuple(d for d in range(1, n + 1) if n % d == 0)\n"
    assert verify(divisors, workspace(tmp_path / "c", as_tuple)).reward == 1.0
    leetcode = (
        "class Solution:\n    def divisors(self, n):\n        return [d for d in range(1, n + 1) if n % d == 0]\n"
    )
    assert verify(divisors, workspace(tmp_path / "d", leetcode)).reward == 1.0
    reads_stdin = "def count_vowels(s):\n    return len(input())\n"
    eof = verify(vowels, workspace(tmp_path / "e", reads_stdin))
    assert eof.tests[0].outcome == "crash" and "EOFError" in eof.tests[0].reason


def test_grades_a_copy_not_the_live_workspace(tmp_path, fixture_tasks):
    live = workspace(tmp_path / "live", "open('made_by_solution.txt', 'w').write('x')\nprint(3)\n")
    os.mkfifo(live / "a_fifo")  # copying must not block on it
    result = verify(stdin_task(), live)
    assert result.reward == 1.0
    assert sorted(p.name for p in live.iterdir()) == ["a_fifo", "solution.py"]


def test_deadline_stops_the_remaining_tests(tmp_path, fixture_tasks):
    task = replace(fixture_tasks[0], limits=Limits(time_s=0.5, deadline_s=1.2))
    result = verify(task, workspace(tmp_path / "ws", "while True:\n    pass\n"))
    assert [t.outcome for t in result.tests] == ["timeout"] * 6
    assert "no result within 0.5 s" in result.tests[0].reason
    assert any("not run: the verification deadline" in t.reason for t in result.tests)


def test_result_record_and_cli(tmp_path, humaneval_rows, capsys):
    row = humaneval_rows[0]
    ws = workspace(tmp_path / "ws", row["prompt"] + row["canonical_solution"])
    result = verify(load_task("humaneval/0"), ws)
    record = json.loads(json.dumps(result.to_json()))
    assert VerifyResult.from_json(record) == result
    with pytest.raises(SystemExit) as done:
        cli.main(["verify", "--task", "humaneval/0", "--workspace", str(ws), "--json"])
    assert done.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["reward"], printed["passed"], printed["total"]) == (1.0, 1, 1)
    assert printed["tests"][0]["outcome"] == "passed" and printed["counts"]["passed"] == 1
    with pytest.raises(SystemExit):
        cli.main(["verify", "--task", "humaneval/0", "--workspace", str(ws)])
    table = capsys.readouterr().out
    assert table.startswith("humaneval/0: reward 1.000 (1/1 passed)") and "passed" in table.splitlines()[2]


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        verify(stdin_task(), tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown sandbox 'docker'"):
        verify(stdin_task(), tmp_path, sandbox="docker")


def test_shaping_is_separate_and_matches_the_seed():
    result = VerifyResult(task_id="t", reward=0.5, passed=1, total=2, tests=[], duration_s=0.0, guards=[])
    assert shaped_reward(result, tool_calls={"bash": 2, "edit": 3}, timed_out=False) == 0.5
    assert shaped_reward(result, tool_calls={"edit": 3}, timed_out=False) == pytest.approx(0.4)
    assert shaped_reward(result, tool_calls={"bash": 40}, timed_out=False) == pytest.approx(0.5 - 0.3)
    assert shaped_reward(result, tool_calls={"bash": 100}, timed_out=False) == pytest.approx(0.0)  # capped at 0.5
    assert shaped_reward(result, tool_calls={"bash": 1}, timed_out=True) == 0.0
    july = Shaping(binary=True, tool_budget=20)
    assert shaped_reward(result, tool_calls={"bash": 21}, timed_out=False, shaping=july) == pytest.approx(-0.03)
    assert result.reward == 0.5  # the raw score is untouched


# ---------------------------------------------------------------------------------- hostile solutions


@pytest.fixture
def sandbox_dir(monkeypatch):
    """Where verify makes its private directories during the test, to check that none is left."""
    path = Path(tempfile.mkdtemp(prefix="wb-test-sandboxes-"))
    path.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _live_processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(f"{pid}: {cmdline!r}")
    return found


def _assert_clean(marker: str, sandbox_dir: Path) -> None:
    assert _live_processes_with(marker) == []
    assert list(sandbox_dir.iterdir()) == []
    assert [p for p in Path("/tmp").iterdir() if marker in p.name] == []


def _relaunched(marker: str, body: str) -> str:
    """A solution that re-executes itself as ``body`` with the marker in its command line (and in the
    command line of every process it forks), so survivors can be found."""
    return f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {body!r}, {marker!r}])\n"


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize(
    "body, outcome, reason",
    [
        pytest.param("while True:\n    pass\n", "timeout", "no result within 1 s", id="infinite-loop"),
        pytest.param(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "timeout",
            "no result within 1 s",
            id="fork-bomb",
        ),
        pytest.param(
            "import sys\nblock = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(block)\n",
            "crash",
            "stdout passed the output limit of 2000000 bytes",
            id="1GB-stdout",
        ),
        pytest.param(
            "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stderr.write(block)\n",
            "crash",
            "stderr passed the output limit",
            id="1GB-stderr",
        ),
        pytest.param("x = bytearray(10 * 2**30)\nprint(3)\n", "crash", "MemoryError", id="10GB-allocation"),
        pytest.param(
            "open('big.bin', 'wb').write(b'x' * (100 << 20))\nprint(3)\n", "crash", "File too large", id="100MB-file"
        ),
    ],
)
def test_hostile_solution_is_contained(tmp_path, sandbox_dir, sandbox, body, outcome, reason):
    marker = f"wb-hostile-{uuid.uuid4().hex}"
    result = verify(
        stdin_task(limits=replace(FAST, file_mb=8)),
        workspace(tmp_path / "ws", _relaunched(marker, body)),
        sandbox=sandbox,
    )
    assert (result.tests[0].outcome, result.total) == (outcome, 1)
    assert reason in result.tests[0].reason
    _assert_clean(marker, sandbox_dir)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_daemon_leaving_the_process_group_is_killed(tmp_path, sandbox_dir, sandbox):
    if sandbox == "none" and os.geteuid() != 0:
        pytest.skip("without bwrap and not root, a process that calls setsid and clears its environment escapes")
    marker = f"wb-hostile-{uuid.uuid4().hex}"
    body = (
        "import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        sleeper = [sys.executable, '-c', 'import time; time.sleep(60)', *sys.argv[1:]]\n"
        "        os.execve(sys.executable, sleeper, {})\n    os._exit(0)\nprint(3)\n"
    )
    result = verify(stdin_task(), workspace(tmp_path / "ws", _relaunched(marker, body)), sandbox=sandbox)
    assert result.tests[0].outcome == "passed"
    _assert_clean(marker, sandbox_dir)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_writes_outside_the_copy_fail_or_vanish(tmp_path, sandbox_dir, sandbox):
    if sandbox == "none" and os.geteuid() != 0:
        pytest.skip("without bwrap and not root, the solution has the user's own write rights")
    marker = f"wb-hostile-{uuid.uuid4().hex}"
    live = tmp_path / "live"
    targets = [
        str(live / "escaped.txt"),
        "../escaped.txt",
        f"/tmp/{marker}",
        f"/var/tmp/{marker}",
        f"/dev/shm/{marker}",
        str(Path.home() / marker),
    ]
    code = (
        f"import os\nfor path in {targets!r}:\n    try:\n        open(path, 'w').write('x')\n"
        "    except OSError:\n        pass\nprint(3)\n"
    )
    result = verify(stdin_task(), workspace(live, code), sandbox=sandbox)
    assert result.reward == 1.0
    assert sorted(p.name for p in live.iterdir()) == ["solution.py"]
    assert not any(Path(t).exists() for t in targets[2:])
    _assert_clean(marker, sandbox_dir)


_SNOOP = '''
def snoop():
    """Look everywhere this process can for the held-out expectation (it starts with SECRET-)."""
    import gc, glob, os, stat, sys
    needle = "SECRET-" + "wb"
    for obj in gc.get_objects():
        if isinstance(obj, str) and needle in obj and obj != needle:
            return obj
    frame = sys._getframe()
    while frame:
        for value in [*frame.f_locals.values(), *frame.f_globals.values()]:
            if isinstance(value, str) and needle in value and value != needle:
                return "frame"
        frame = frame.f_back
    places = glob.glob("/proc/*/cmdline") + glob.glob("/proc/*/environ")
    places += [p for p in glob.glob("/proc/self/fd/*") if os.path.isfile(p)]  # not our pipes
    for top in ["..", "../..", "/tmp", os.environ.get("TMPDIR", "/tmp")]:
        for root, dirs, files in os.walk(top):
            places += [os.path.join(root, f) for f in files]
            if len(places) > 20000:
                break
    for path in places:
        try:
            if not stat.S_ISREG(os.stat(path).st_mode) and "/proc/" not in path:
                continue  # a FIFO would block
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except OSError:
            continue
        if needle.encode() in data and b"needle = " not in data:
            return path
    return "nothing"
'''


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("kind", ["function_call", "humaneval"])
def test_held_out_tests_cannot_be_read(tmp_path, sandbox_dir, sandbox, kind):
    secret = f"SECRET-wb{uuid.uuid4().hex}"
    limits = Limits(time_s=20.0)
    if kind == "function_call":
        task = Task(
            id="t/secret",
            instruction="",
            files={},
            visible_tests="",
            test_kind="function_call",
            held_out_tests=[{"input": [], "output": [secret]}],
            entry_point="snoop",
            limits=limits,
        )
    else:
        task = Task(
            id="t/secret",
            instruction="",
            files={},
            visible_tests="",
            test_kind="humaneval",
            held_out_tests=[
                {
                    "prelude": "def snoop():\n    pass\n",
                    "check": f"def check(candidate):\n    assert candidate() == {secret!r}\n",
                }
            ],
            entry_point="snoop",
            limits=limits,
        )
    result = verify(task, workspace(tmp_path / "ws", _SNOOP), sandbox=sandbox)
    assert result.tests[0].outcome == "wrong"
    assert "'nothing'" in result.tests[0].reason
    _assert_clean(secret, sandbox_dir)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_humaneval_data_is_hidden(tmp_path, sandbox_dir, sandbox):
    """bwrap masks it; in plain mode the fresh uid, with no capability, cannot enter its 0700 folder."""
    code = (
        f"try:\n    open({str(humaneval_path())!r}, 'rb').read()\n    print('visible')\n"
        "except OSError:\n    print('hidden')\n"
    )
    result = verify(stdin_task("hidden\n"), workspace(tmp_path / "ws", code), sandbox=sandbox)
    if "uid" not in result.guards and "bwrap" not in result.guards:
        pytest.skip("not root and no bwrap: the solution has this user's rights")
    assert result.tests[0].outcome == "passed", result.tests[0].reason


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_network_is_unreachable(tmp_path, sandbox_dir, sandbox):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (
            f"import socket\nfor address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n    try:\n"
            "        socket.create_connection(address, timeout=2).close()\n        print('connected', address)\n"
            "        break\n    except OSError:\n        pass\nelse:\n    print('blocked')\n"
        )
        result = verify(
            stdin_task("blocked\n", limits=Limits(time_s=10.0)), workspace(tmp_path / "ws", code), sandbox=sandbox
        )
        if "netns" not in result.guards:
            pytest.skip("no network namespace here (not root, no bwrap)")
        assert result.tests[0].outcome == "passed", result.tests[0].reason
        with pytest.raises(BlockingIOError):
            server.accept()
    _assert_clean("never-used-marker", sandbox_dir)


def test_the_jails_interpreter_is_named_by_its_real_folder(tmp_path, monkeypatch):
    """Under bwrap the jail mounts the interpreter's folders by their real paths (`python_dirs`): an interpreter
    reached through a linked folder (a worktree's .venv linked to the main checkout's) must be named through the
    real folder, or every graded test 'crashes' with the jail unable to start it (seen: 64 of 64)."""
    import os
    import sys

    from workbench.verify import jail_host

    real = tmp_path / "venv" / "bin"
    real.mkdir(parents=True)
    (tmp_path / "linked").symlink_to(tmp_path / "venv")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "linked" / "bin" / "python"))
    host = jail_host.Host(root=False, prlimit="prlimit", setpriv="setpriv", bwrap="bwrap", unshare=None)
    got = jail_host.interpreter(host, bwrap=True)
    assert got == os.path.join(os.path.realpath(real), "python")
