"""The project's style check: python tools/check_style.py PACKAGE_DIR [--json]

Rules, for every .py file of the package:

- S1 docstring: every public function, class and method (a name not starting with "_") has one.
- S2 annotations: every public function and method annotates each parameter (except self and cls)
  and its return value.
- S3 print: no call to print() (the package returns values; callers print).
- S4 unused import: every imported name is used in the module (in __init__.py, names listed in
  __all__ count as used).
- S5 bare except: no "except:" without an exception type.

Prints one line per problem, "FILE:LINE: CODE message", and exits 1 if there is any (0 otherwise).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def _public(name: str) -> bool:
    return not name.startswith("_")


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                return {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _check_function(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[tuple[int, str, str]]:
    problems = []
    kind = "method" if method else "function"
    if ast.get_docstring(node) is None:
        problems.append((node.lineno, "S1", f"public {kind} {node.name} has no docstring"))
    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    args += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
    for i, arg in enumerate(args):
        if method and i == 0 and arg.arg in ("self", "cls"):
            continue
        if arg.annotation is None:
            problems.append((node.lineno, "S2", f"{node.name}: parameter {arg.arg} has no annotation"))
    if node.returns is None:
        problems.append((node.lineno, "S2", f"{node.name}: no return annotation"))
    return problems


def check_file(path: Path) -> list[tuple[int, str, str]]:
    """The problems of one file as (line, code, message)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    problems: list[tuple[int, str, str]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            problems += _check_function(node, method=False)
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            if ast.get_docstring(node) is None:
                problems.append((node.lineno, "S1", f"public class {node.name} has no docstring"))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(item.name):
                    problems += _check_function(item, method=True)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    if path.name == "__init__.py":
        used |= _all_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            problems.append((node.lineno, "S3", "call to print()"))
        elif isinstance(node, ast.ExceptHandler) and node.type is None:
            problems.append((node.lineno, "S5", "bare except:"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:
                name = (alias.asname or alias.name).split(".")[0]
                if name not in used:
                    problems.append((node.lineno, "S4", f"unused import {name}"))
    return sorted(problems)


def check(package: Path) -> list[str]:
    """Every problem of the package's files, one "FILE:LINE: CODE message" line each."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for line, code, message in check_file(path):
            out.append(f"{path.as_posix()}:{line}: {code} {message}")
    return out


def main(argv: list[str]) -> int:
    if not argv or not Path(argv[0]).is_dir():
        sys.stderr.write("usage: python tools/check_style.py PACKAGE_DIR [--json]\n")
        return 2
    problems = check(Path(argv[0]))
    if "--json" in argv:
        sys.stdout.write(json.dumps(problems) + "\n")
    else:
        sys.stdout.write("".join(p + "\n" for p in problems) or "no problems\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
