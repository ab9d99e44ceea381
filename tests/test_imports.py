"""The light clients stay light: importing the trainer, the rollout runner or the proxy client must not
import OpenEnv's capture server (gradio, pandas, fastmcp: ~3,400 modules, 7-10 s here)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "workbench.train.grpo",
        "workbench.rollout.run",
        "workbench.capture.client",
        "workbench.evaluate.run",
        "workbench.turns.derive",
        "workbench.verify",
    ],
)
def test_importing_does_not_pull_openenvs_server(module):
    code = (
        f"import sys; import {module}; heavy = sorted(m for m in ('gradio', 'pandas', 'openenv', 'fastmcp') "
        "if m in sys.modules); print(heavy, len(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    heavy, count = out.stdout.rsplit(" ", 1)
    assert heavy == "[]", (module, out.stdout)
    assert int(count) < 1500, (module, count)


def test_every_subcommands_help_renders():
    """argparse %-formats help text: one docstring's "17% of rows" once broke `workbench train --help`."""
    import argparse

    from workbench.cli import build_parser

    parser = build_parser()
    assert "train" in parser.format_help()  # the top level lists every subcommand's help line
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"train", "eval", "rollout", "verify"} <= set(subs.choices)
    for name, sub in subs.choices.items():
        text = sub.format_help()
        assert name in text and "usage:" in text
    assert "--shared-prefix {auto,on,off}" in subs.choices["train"].format_help()


def test_the_package_names_its_stages_and_loads_them_on_first_use():
    code = (
        "import sys, workbench; before = sorted(m for m in sys.modules if m.startswith('workbench.')); "
        "names = {n: getattr(workbench, n).__module__ for n in workbench.__all__}; "
        "print(before); print(names)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    before, names = out.stdout.splitlines()
    assert before == "[]"
    assert "'load_task': 'workbench.tasks.catalog'" in names and "'GRPORun': 'workbench.train.grpo'" in names
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        import workbench

        workbench.nothing  # noqa: B018


def _module_level_imports() -> dict[str, set[str]]:
    """workbench module -> the workbench modules it imports when it is imported: its top-level imports,
    not those inside functions (run on first use) or under ``if TYPE_CHECKING:`` (never run)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "workbench"
    files = {}
    for f in root.rglob("*.py"):
        if "data" in f.relative_to(root).parts:
            continue
        parts = ("workbench", *f.relative_to(root).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {}
    for mod, f in files.items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        nodes = []
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                nodes += node.orelse
            elif isinstance(node, (ast.If, ast.Try)):  # e.g. an optional import: both branches may run
                nodes += [
                    *node.body,
                    *getattr(node, "orelse", []),
                    *getattr(node, "finalbody", []),
                    *(s for h in getattr(node, "handlers", []) for s in h.body),
                ]
            else:
                nodes.append(node)
        targets = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        # the target module and the packages above it run first (not the importer's own, nor the lazy root)
        graph[mod] = {
            p
            for t in targets
            for i in range(2, t.count(".") + 2)
            if (p := ".".join(t.split(".")[:i])) in files and p != mod and not mod.startswith(p + ".")
        }
    return graph


def test_workbench_modules_import_each_other_in_one_direction():
    """No import cycle among workbench modules at import time (a cycle makes the import order matter:
    whichever module is imported first sees the other half-initialised)."""
    graph = _module_level_imports()
    assert {"workbench.tasks.harbor", "workbench.tasks.record"} <= graph[
        "workbench.tasks.catalog"
    ]  # the scan sees imports
    cycles, state = [], {}

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = "open"
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep) :] + [dep] if dep in path else [mod, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)
