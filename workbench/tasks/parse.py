"""What a dataset row becomes: HumanEval problems and DeepCoder-schema rows (DeepCoder, the fixture, the
easy set, your JSONL) parsed into `Task` records, with their instruction and visible examples.

`workbench.tasks.catalog` reads the rows (the spec says from where) and calls these; nothing here reads a file
or the Hub, so the parsing is testable on a literal row:

    from workbench.tasks.parse import Unusable, humaneval_task, row_task, usable_tasks
    from workbench.tasks import Limits
    task = row_task({"problem": "Print 2.", "tests": [{"type": "stdin_stdout", "input": "", "output": "2"}]},
                    "mine/0", "jsonl", 12, Limits())
    tasks = usable_tasks([row, ...], "jsonl:/data/mine.jsonl#", "jsonl", 12, Limits(), "mine")  # warns what it skips
    humaneval_task(humaneval_row, Limits())   # a line of HumanEval.jsonl.gz, parsed

The rules (which tests a row keeps, how the statement's examples become ``visible_tests``) are the ones
`workbench.tasks.catalog` documents for the specs.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Iterable
from typing import Any

from workbench.tasks.record import WRITE_HINT, Limits, Task

__all__ = ["Unusable", "humaneval_task", "row_task", "usable_tasks"]


# ---------------------------------------------------------------------------------------------- HumanEval


def humaneval_task(row: dict[str, Any], limits: Limits) -> Task:
    """A HumanEval problem (``task_id``, ``prompt``, ``entry_point``, ``test``) as a ``humaneval`` task."""
    prompt, entry = row["prompt"], row["entry_point"]
    instruction = (
        f"Implement the Python function `{entry}` described below in a file named `solution.py` in the "
        "current directory.\n\n"
        f"```python\n{prompt.strip()}\n```\n\n"
        f"solution.py must define `{entry}` with exactly this signature, together with the imports and "
        "helper functions it needs. The examples from the docstring are in visible_tests.txt: check your "
        f"function against them before you finish. Hidden tests will import `{entry}` from solution.py and "
        "call it.\n"
    )
    return Task(
        id=f"humaneval/{row['task_id'].split('/')[1]}",
        instruction=instruction,
        files={},
        visible_tests=_humaneval_examples(prompt, entry),
        held_out_tests=[{"prelude": prompt, "check": row["test"]}],
        test_kind="humaneval",
        entry_point=entry,
        limits=limits,
        source="humaneval",
    )


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
    return (
        f"The docstring of {entry} gives no examples: the description in the instruction is the whole specification.\n"
    )


# ---------------------------------------------------------------------------- DeepCoder / JSONL problems


class Unusable(Exception):
    """A row that cannot become a task (no usable test); the message says why. `workbench.tasks.catalog` turns it
    into a ValueError for one named task and into a skipped-row warning for a collection."""


def usable_tasks(
    rows: Iterable[dict[str, Any]], prefix: str, source: str, max_tests: int, limits: Limits, name: str
) -> list[Task]:
    """Every row that can become a task, ids ``prefix + row index``; the rest are skipped with one warning
    (naming ``name``) that counts them by reason. Its stacklevel points at the caller of `load_tasks`."""
    tasks: list[Task] = []
    skipped: dict[str, int] = {}
    for i, row in enumerate(rows):
        try:
            tasks.append(row_task(row, f"{prefix}{i}", source, max_tests, limits))
        except Unusable as exc:
            skipped[str(exc)] = skipped.get(str(exc), 0) + 1
    if skipped:
        detail = "; ".join(f"{n} x {why}" for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]))
        warnings.warn(f"{name}: skipped {sum(skipped.values())} rows: {detail}", stacklevel=3)
    return tasks


def row_task(row: dict[str, Any], task_id: str, source: str, max_tests: int, limits: Limits) -> Task:
    """One DeepCoder-schema row (``problem``, ``tests``) as a task, or `Unusable`."""
    statement = row.get("problem")
    if not isinstance(statement, str) or not statement.strip():
        raise Unusable("no problem statement")
    tests = _parse_tests(row.get("tests"))
    if not tests:
        raise Unusable("no usable test")
    kind, fn_name = tests[0][0], tests[0][1]
    held = [t for k, f, t in tests if k == kind and f == fn_name][:max_tests]
    statement = _clean_statement(statement)
    # The easy set is for 135M-parameter models, which lose the thread in a long instruction: one line,
    # the examples only in visible_tests.txt.
    instruction = (
        f"{statement.split(chr(10))[0]}{WRITE_HINT}"
        if source == "easy"
        else _deepcoder_instruction(statement, kind, fn_name)
    )
    return Task(
        id=task_id,
        instruction=instruction,
        files={},
        visible_tests=_statement_examples(statement, kind),
        held_out_tests=held,
        test_kind=kind,
        entry_point=fn_name,
        limits=limits,
        source=source,
    )


def _parse_tests(raw: Any) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(kind, fn_name, held-out test) for each usable entry of a row's ``tests``."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise Unusable("tests is not valid JSON") from None
    if not isinstance(raw, list):
        raise Unusable(f"tests is a {type(raw).__name__}, expected a list")
    usable: list[tuple[str, str | None, dict[str, Any]]] = []
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
    r"|now solve the problem and return the code\.?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)


def _clean_statement(statement: str) -> str:
    """The statement without the dataset's prompt boilerplate (it asks for a chat answer, not a file)."""
    return re.sub(r"\n{3,}", "\n\n", _BOILERPLATE.sub("", statement)).strip()


def _deepcoder_instruction(statement: str, kind: str, fn_name: str | None) -> str:
    if kind == "stdin_stdout":
        how = (
            "Write your solution as a Python program in a file named `solution.py` in the current "
            "directory: it reads the input from standard input and prints the answer to standard output. "
            "The examples from the statement are in visible_tests.txt; run your program on them (for "
            "example `python solution.py < input.txt`) and fix it until its output matches. Hidden tests "
            "will run `python solution.py` on other inputs."
        )
    else:
        how = (
            f"Write your solution in a file named `solution.py` in the current directory that defines the "
            f"function `{fn_name}`. The examples from the statement are in visible_tests.txt; call your "
            f"function on them and fix it until it returns the expected values. Hidden tests will import "
            f"`{fn_name}` from solution.py, call it with other arguments and compare what it returns."
        )
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
    start = next(
        (i for i, line in enumerate(lines) if _EXAMPLES_HEAD.fullmatch(line) or _SAMPLE_INPUT.fullmatch(line)), None
    )
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
        out = [
            "Examples from the problem statement: `python solution.py < input` must print the expected "
            "output (trailing whitespace does not matter)."
        ]
        for n, (inp, exp) in enumerate(pairs, 1):
            out += [f"\n=== example {n}: input ===", _trim(inp), f"=== example {n}: expected output ===", _trim(exp)]
        return "\n".join(out) + "\n"
    return "Examples from the problem statement:\n\n" + "\n".join(lines[start:end]).strip() + "\n"


def _trim(lines: list[str]) -> str:
    return "\n".join(lines).strip("\n")
