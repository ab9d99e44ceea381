"""The easy task set: generated file in sync with its generator, stable ids, the train/eval split, and
every reference solution passing its own held-out tests through the real grader."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

from workbench.tasks.catalog import EASY_PATH, easy_split, load_task, load_tasks
from workbench.verify import verify_many

ROOT = Path(__file__).resolve().parents[1]
# sha256 of the twelve lines easy_tasks.jsonl had before it grew (commit 8c485ad): ids 0-11 must not change.
ORIGINAL_12_SHA256 = "19965a98d87599a90d587c74f3175d5014a8d3e3dccaf88d4d9097f5e2ad12d6"
ORIGINAL_NAMES = [
    "add",
    "subtract",
    "multiply",
    "square",
    "double",
    "is_even",
    "maximum",
    "reverse",
    "length",
    "first",
    "total",
    "negate",
]


def _generator():
    spec = importlib.util.spec_from_file_location("make_easy_tasks", ROOT / "scripts" / "make_easy_tasks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_easy_tasks"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_committed_file_is_the_generators_output_and_keeps_the_original_twelve():
    text = EASY_PATH.read_text(encoding="utf-8")
    assert text == gen.render()
    lines = text.splitlines(keepends=True)
    assert len(lines) >= 48
    assert hashlib.sha256("".join(lines[:12]).encode()).hexdigest() == ORIGINAL_12_SHA256
    assert gen.main(["--check"]) == 0


def test_ids_are_stable_and_each_id_loads_its_task():
    tasks = load_tasks("easy")
    assert [t.id for t in tasks] == [f"easy/{i}" for i in range(len(gen.SPECS))]
    assert [t.entry_point for t in tasks] == [s.name for s in gen.SPECS]
    assert [t.entry_point for t in tasks[:12]] == ORIGINAL_NAMES
    for t in tasks:
        assert load_task(t.id) == t
        assert len(t.held_out_tests) == 6 and t.source == "easy" and t.test_kind == "function_call"
        assert t.instruction.startswith(f"Create solution.py with a function {t.entry_point}(")
        # the tests tell solutions apart: not every expected value is the same
        assert len({repr(x["output"]) for x in t.held_out_tests}) > 1, t.id


def test_split_is_fixed_disjoint_and_covers_every_task():
    every = [t.id for t in load_tasks("easy")]
    train = [t.id for t in load_tasks("easy-train")]
    held = [t.id for t in load_tasks("easy-eval")]
    assert not set(train) & set(held) and sorted(train + held, key=every.index) == every
    assert (len(train), len(held)) == (30, 18)
    assert held == [f"easy/{i}" for i in range(13, 48, 2)]  # the rule, written out
    assert all(f"easy/{i}" in train for i in range(12))  # earlier demos trained on these: never held out
    assert [easy_split(i) for i in ("easy/11", "easy/12", "easy/13")] == ["train", "train", "eval"]
    assert [t.id for t in load_tasks("easy-eval[:2]")] == ["easy/13", "easy/15"]
    assert load_tasks("easy-eval")[0] == load_task("easy/13")


def test_the_generator_refuses_bad_specs():
    spec = gen.SPECS[0]
    with pytest.raises(ValueError, match="duplicate task names"):
        gen.rows([spec, spec])
    with pytest.raises(ValueError, match="expected 6"):
        gen.rows([gen.EasySpec(spec.solution, spec.description, spec.inputs[:5])])


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_every_reference_solution_passes_all_its_tests(tmp_path, sandbox):
    tasks = load_tasks("easy")
    items = []
    for task, spec in zip(tasks, gen.SPECS):
        ws = tmp_path / task.id.replace("/", "-")
        ws.mkdir()
        (ws / "solution.py").write_text(gen.reference_source(spec))
        items.append((task, ws))
    results = verify_many(items, workers=2, progress=False, sandbox=sandbox)
    failed = {r.task_id: r.table() for r in results if r.reward != 1.0}
    assert not failed, "\n".join(failed.values())
    # and a wrong solution does not pass: the grader really compares
    (items[0][1] / "solution.py").write_text("def add(a, b):\n    return a - b\n")
    assert verify_many(items[:1], workers=1, progress=False, sandbox=sandbox)[0].reward < 1.0
