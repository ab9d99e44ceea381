"""Generate workbench/data/easy_tasks.jsonl: one-line Python function problems for 135M-parameter models.

Each task is a reference solution written below as a real function (its name and signature are the
task's), a description, and six test inputs. The expected outputs are computed by calling the
reference solution, so the held-out tests are right by construction; the first two tests are the
statement's ``Examples:`` lines (and stay among the held-out tests, as in the original twelve).

    .venv/bin/python scripts/make_easy_tasks.py           # (re)write the JSONL
    .venv/bin/python scripts/make_easy_tasks.py --check   # exit 1 when the committed file is stale

Order is the task id (``easy/N`` is line N): the first twelve are the original set, byte for byte;
tasks 12-47 come in sibling pairs (``add_one`` / ``subtract_one``, ``upper`` / ``lower``, ...) so that
the split in `workbench.tasks.catalog.easy_split` (odd ids from 12 on are evaluation tasks) puts one of each
pair on each side. Append new tasks at the end: inserting one would change the ids of the rest.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EasySpec", "SPECS", "rows", "render", "reference_source", "main", "OUT"]

OUT = Path(__file__).resolve().parent.parent / "workbench" / "data" / "easy_tasks.jsonl"
Value = int | float | str | bool | list


@dataclass(frozen=True)
class EasySpec:
    """One task: the reference solution (its name and parameters are the task's), what it does, and the
    arguments of its six tests (a bare value for one-parameter functions, a tuple otherwise)."""

    solution: Callable[..., Value]
    description: str
    inputs: Sequence[Value | tuple[Value, ...]]

    @property
    def name(self) -> str:
        return self.solution.__name__

    @property
    def params(self) -> list[str]:
        return list(inspect.signature(self.solution).parameters)

    def args(self) -> list[list[Value]]:
        one = len(self.params) == 1
        return [[x] if one else list(x) for x in self.inputs]  # type: ignore[arg-type]


# -- the original twelve (ids 0-11) ------------------------------------------------------------------

def add(a, b):
    return a + b


def subtract(a, b):
    return a - b


def multiply(a, b):
    return a * b


def square(n):
    return n * n


def double(n):
    return 2 * n


def is_even(n):
    return n % 2 == 0


def maximum(a, b):
    return max(a, b)


def reverse(s):
    return s[::-1]


def length(s):
    return len(s)


def first(items):
    return items[0]


def total(items):
    return sum(items)


def negate(n):
    return -n


# -- sibling pairs (ids 12-47; the second of each pair, odd id, is an evaluation task) ---------------

def add_one(n):
    return n + 1


def subtract_one(n):
    return n - 1


def triple(n):
    return 3 * n


def halve(n):
    return n / 2


def is_positive(n):
    return n > 0


def is_negative(n):
    return n < 0


def is_zero(n):
    return n == 0


def is_odd(n):
    return n % 2 != 0


def absolute(n):
    return abs(n)


def cube(n):
    return n ** 3


def minimum(a, b):
    return min(a, b)


def is_equal(a, b):
    return a == b


def concat(a, b):
    return a + b


def repeat(s, n):
    return s * n


def upper(s):
    return s.upper()


def lower(s):
    return s.lower()


def last(items):
    return items[-1]


def count(items):
    return len(items)


def is_empty(s):
    return s == ""


def strip(s):
    return s.strip()


def starts_with(s, prefix):
    return s.startswith(prefix)


def ends_with(s, suffix):
    return s.endswith(suffix)


def average(a, b):
    return (a + b) / 2


def add_three(a, b, c):
    return a + b + c


def remainder(a, b):
    return a % b


def integer_divide(a, b):
    return a // b


def power(a, b):
    return a ** b


def is_divisible(a, b):
    return a % b == 0


def first_char(s):
    return s[0]


def last_char(s):
    return s[-1]


def largest(items):
    return max(items)


def smallest(items):
    return min(items)


def contains(items, x):
    return x in items


def is_greater(a, b):
    return a > b


def greet(name):
    return "Hello, " + name


def word_count(s):
    return len(s.split())


SPECS: list[EasySpec] = [
    EasySpec(add, "returns the sum of a and b", [(1, 2), (-5, 5), (10, -3), (100, 200), (-4, -6), (2, 2)]),
    EasySpec(subtract, "returns a minus b", [(5, 3), (0, 7), (-2, -2), (100, 1), (3, 10), (1, 1)]),
    EasySpec(multiply, "returns the product of a and b", [(2, 3), (0, 9), (-2, 4), (7, 7), (1, -1), (12, 10)]),
    EasySpec(square, "returns n times n", [3, 0, -4, 10, 1, 12]),
    EasySpec(double, "returns two times n", [3, 0, -4, 10, 1, 21]),
    EasySpec(is_even, "returns True if n is even and False otherwise", [2, 3, 0, -4, 7, 100]),
    EasySpec(maximum, "returns the larger of a and b", [(1, 2), (5, 3), (-1, -7), (4, 4), (0, -3), (10, 20)]),
    EasySpec(reverse, "returns the string s reversed", ["abc", "", "a", "hello", "ab", "racecar"]),
    EasySpec(length, "returns the number of characters in the string s", ["abc", "", "hello world", "a", "xy", "python"]),
    EasySpec(first, "returns the first element of the list items",
             [[1, 2, 3], ["a", "b"], [0], [9, 8], [-1, 5], [True, False]]),
    EasySpec(total, "returns the sum of the numbers in the list items", [[1, 2, 3], [], [5], [-1, 1], [10, 20, 30], [2, 2, 2, 2]]),
    EasySpec(negate, "returns -n", [3, 0, -4, 10, 1, -21]),
    # 12-47
    EasySpec(add_one, "returns n plus one", [1, -1, 0, 41, -10, 999]),
    EasySpec(subtract_one, "returns n minus one", [1, 0, 10, -5, 100, 2]),
    EasySpec(triple, "returns three times n", [2, 0, -3, 10, 1, 7]),
    EasySpec(halve, "returns n divided by 2", [4, 7, 0, -6, 1, 100]),
    EasySpec(is_positive, "returns True if n is greater than zero and False otherwise", [5, -2, 0, 1, -100, 42]),
    EasySpec(is_negative, "returns True if n is less than zero and False otherwise", [-3, 4, 0, -1, 100, -50]),
    EasySpec(is_zero, "returns True if n is zero and False otherwise", [0, 5, -1, 100, 1, -7]),
    EasySpec(is_odd, "returns True if n is odd and False otherwise", [3, 4, 0, -3, 11, 100]),
    EasySpec(absolute, "returns the absolute value of n", [-5, 3, 0, -1, 42, -100]),
    EasySpec(cube, "returns n times n times n", [2, 3, 0, -2, 1, 10]),
    EasySpec(minimum, "returns the smaller of a and b", [(1, 2), (5, 3), (-1, -7), (4, 4), (0, -3), (10, 20)]),
    EasySpec(is_equal, "returns True if a equals b and False otherwise", [(3, 3), (1, 2), (0, 0), (-5, 5), (7, 7), (10, 1)]),
    EasySpec(concat, "returns the string a followed by the string b",
             [("ab", "cd"), ("", "x"), ("hello", " world"), ("a", "a"), ("1", "2"), ("x", "")]),
    EasySpec(repeat, "returns the string s repeated n times", [("ab", 3), ("x", 0), ("hi", 1), ("-", 5), ("", 4), ("ok", 2)]),
    EasySpec(upper, "returns the string s in upper case", ["abc", "Hello", "", "ABC", "a1b2", "python code"]),
    EasySpec(lower, "returns the string s in lower case", ["ABC", "Hello", "", "abc", "A1B2", "PYTHON Code"]),
    EasySpec(last, "returns the last element of the list items", [[1, 2, 3], ["a", "b"], [0], [9, 8], [-1, 5], [True, False]]),
    EasySpec(count, "returns the number of elements in the list items", [[1, 2, 3], [], ["a"], [0, 0], [5, 4, 3, 2, 1], [True]]),
    EasySpec(is_empty, "returns True if the string s is empty and False otherwise", ["", "a", " ", "hello", "0", "xyz"]),
    EasySpec(strip, "returns the string s without the spaces at its start and end",
             ["  hi  ", "abc", "   ", " a b ", "x  ", "  y"]),
    EasySpec(starts_with, "returns True if the string s starts with prefix and False otherwise",
             [("hello", "he"), ("hello", "lo"), ("abc", ""), ("", "a"), ("python", "python"), ("cat", "dog")]),
    EasySpec(ends_with, "returns True if the string s ends with suffix and False otherwise",
             [("hello", "lo"), ("hello", "he"), ("abc", ""), ("", "a"), ("python", "python"), ("cat", "at")]),
    EasySpec(average, "returns the average of a and b", [(2, 4), (1, 2), (0, 0), (-4, 4), (10, 20), (7, 8)]),
    EasySpec(add_three, "returns the sum of a, b and c", [(1, 2, 3), (0, 0, 0), (-1, 1, 5), (10, 20, 30), (-2, -3, -4), (7, 0, 1)]),
    EasySpec(remainder, "returns the remainder of a divided by b", [(7, 3), (10, 5), (5, 7), (100, 9), (9, 2), (0, 4)]),
    EasySpec(integer_divide, "returns a divided by b, rounded down to a whole number",
             [(7, 2), (9, 3), (1, 5), (100, 10), (-7, 2), (8, 8)]),
    EasySpec(power, "returns a raised to the power b", [(2, 3), (5, 0), (3, 2), (10, 3), (-2, 3), (1, 100)]),
    EasySpec(is_divisible, "returns True if a is divisible by b and False otherwise",
             [(6, 3), (7, 2), (0, 5), (10, 4), (12, 6), (9, 9)]),
    EasySpec(first_char, "returns the first character of the string s", ["abc", "x", "hello", "Zoo", "123", " a"]),
    EasySpec(last_char, "returns the last character of the string s", ["abc", "x", "hello", "Zoo", "123", "a "]),
    EasySpec(largest, "returns the largest number in the list items", [[1, 5, 3], [-2, -7], [0], [4, 4, 4], [10, 20, 30], [-1, 0, 1]]),
    EasySpec(smallest, "returns the smallest number in the list items", [[1, 5, 3], [-2, -7], [0], [4, 4, 4], [10, 20, 30], [-1, 0, 1]]),
    EasySpec(contains, "returns True if x is in the list items and False otherwise",
             [([1, 2, 3], 2), ([1, 2, 3], 5), ([], 0), (["a", "b"], "b"), ([0], 0), ([4, 5], -4)]),
    EasySpec(is_greater, "returns True if a is greater than b and False otherwise",
             [(3, 2), (2, 3), (4, 4), (0, -1), (-5, -2), (100, 99)]),
    EasySpec(greet, "returns the string \"Hello, \" followed by name", ["Bob", "Ann", "", "World", "x", "Sam Lee"]),
    EasySpec(word_count, "returns the number of words in the string s (words are separated by spaces)",
             ["hello world", "", "one", "a b c", "  two  words ", "python is fun"]),
]


def _literal(value: Value) -> str:
    """An argument as the statement shows it: strings in double quotes (as JSON), the rest as Python."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def reference_source(spec: EasySpec) -> str:
    """The reference solution as solution.py would hold it."""
    return inspect.getsource(spec.solution)


def rows(specs: Sequence[EasySpec] = SPECS) -> list[dict[str, str]]:
    """DeepCoder-schema rows: ``problem``, ``tests`` (a JSON string, as the dataset has it), ``metadata``."""
    out = []
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task names: {sorted(n for n in set(names) if names.count(n) > 1)}")
    for spec in specs:
        if len(spec.inputs) != 6:
            raise ValueError(f"{spec.name}: {len(spec.inputs)} tests, expected 6")
        args = spec.args()
        # Expected outputs by running the reference solution: the tests cannot disagree with it.
        outputs = [spec.solution(*a) for a in args]
        tests = [{"type": "function_call", "fn_name": spec.name, "input": a, "output": [o]} for a, o in zip(args, outputs)]
        examples = "\n".join(f"{spec.name}({', '.join(_literal(x) for x in a)}) == {o!r}" for a, o in zip(args[:2], outputs))
        problem = (f"Create solution.py with a function {spec.name}({', '.join(spec.params)}) that "
                   f"{spec.description}.\n\nExamples:\n{examples}")
        out.append({"problem": problem, "tests": json.dumps(tests), "metadata": json.dumps({"difficulty": "WARMUP"})})
    return out


def render(specs: Sequence[EasySpec] = SPECS) -> str:
    """The JSONL text, one row per line."""
    return "".join(json.dumps(r) + "\n" for r in rows(specs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed file is up to date")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'STALE: run scripts/make_easy_tasks.py'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {len(SPECS)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
