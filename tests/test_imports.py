"""The package's shape: a folder per stage, each behind its face, imports going down the stages only; and the
light clients stay light (importing the trainer, the rollout runner or the proxy client must not import OpenEnv's
capture server: gradio, pandas, fastmcp, ~3,400 modules, 7-10 s here)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

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


def test_a_face_loads_its_modules_on_first_use_and_the_package_exports_nothing():
    code = (
        "import sys, workbench.tasks as t; before = sorted(m for m in sys.modules if m.startswith('workbench.')); "
        "name = t.load_task.__module__; after = 'workbench.tasks.catalog' in sys.modules; "
        "import types, workbench; print(before); "
        "print(name, after, [n for n, v in vars(workbench).items() if not isinstance(v, types.ModuleType) and n[:2] != '__'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    before, loaded = out.stdout.splitlines()
    assert before == "['workbench._lazy', 'workbench.tasks']"  # the face and its loader, nothing behind it
    assert loaded == "workbench.tasks.catalog True []"  # nothing but the subpackages Python binds once loaded
    import workbench.tasks

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        workbench.tasks.nothing  # noqa: B018


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workbench"
# The stages from the bottom up: a stage may import those on lower lines only (and the leaves); stages on one
# line do not import each other. README's "The package" draws the same picture.
LAYERS = [
    {"_compat", "_lazy", "paths", "procs", "_watchdog", "cpu"},  # leaves: every stage may use them
    {"runs"},  # a leaf too (a run folder), on paths
    {"tasks", "turns", "sandbox"},
    {"harnesses", "verify", "views"},
    {"capture"},  # asks the harnesses what each call is for
    {"engine"},  # local_stack starts the engine and the proxy before it
    {"rollout"},
    {"train"},
    {"evaluate"},
    {"cli"},
    {"__init__", "__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
LEAVES = LAYERS[0] | LAYERS[1]
STAGES = sorted(set(RANK) - LEAVES - LAYERS[-1])


def _sources() -> dict[str, Path]:
    """workbench module -> its file (package data excluded)."""
    files = {}
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE)
        if rel.parts[0] == "data":
            continue
        parts = ("workbench", *rel.with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return files


def _imports(f: Path, package: str) -> list[tuple[int, str, list[str]]]:
    """Every workbench import in `f`, wherever it is (top level, in a function, under TYPE_CHECKING):
    (line, module, names)."""
    found = []
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "workbench"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] == "workbench":
                found.append((node.lineno, base, [a.name for a in node.names]))
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges() -> list[tuple[str, str, str]]:
    """(importing file:line, importer's unit, imported module) for every workbench import."""
    edges = []
    for mod, f in _sources().items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for line, target, names in _imports(f, package):
            targets = [f"{target}.{n}" for n in names] if target == "workbench" else [target]
            edges += [(f"{f.relative_to(ROOT)}:{line}", _unit(mod), t) for t in targets]
    return edges


def test_ls_workbench_shows_the_stages_and_the_leaves():
    tops = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name not in ("data", "py.typed", "__pycache__")}
    assert tops == set(RANK), tops ^ set(RANK)
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_stages_import_down_only():
    """No stage imports one above it or beside it, not even inside a function or for the type checker."""
    edges = _edges()
    units = {(a, _unit(t)) for _, a, t in edges}
    assert {("capture", "harnesses"), ("rollout", "verify"), ("cli", "evaluate")} <= units  # the scan sees imports
    wrong = [f"{where}: {a} imports {t}" for where, a, t in edges if _unit(t) != a and RANK[_unit(t)] >= RANK[a]]
    assert not wrong, "\n".join(wrong)


def test_no_stage_reaches_into_another_stages_private_modules():
    """Across stages, only faces are imported: `from workbench.capture import ProxyClient`, never
    `from workbench.capture.client import ProxyClient`."""
    private = [
        f"{where}: {t}"
        for where, a, t in _edges()
        if _unit(t) != a and _unit(t) not in LEAVES and len(t.split(".")) > 2
    ]
    assert not private, "\n".join(private)


def _face(stage: str) -> tuple[list[str], dict[str, str]]:
    """A face's ``__all__`` (as the package gives it) and its TYPE_CHECKING imports (name -> module)."""
    import importlib

    from workbench._lazy import typed_homes

    face = importlib.import_module(f"workbench.{stage}")
    return list(face.__all__), typed_homes(PACKAGE / stage / "__init__.py", f"workbench.{stage}")


@pytest.mark.parametrize("stage", STAGES)
def test_each_face_names_each_of_its_names_once_and_where_it_lives(stage):
    names, homes = _face(stage)
    assert names and names == list(homes), names  # one list: the TYPE_CHECKING imports, each name once
    source = (PACKAGE / stage / "__init__.py").read_text(encoding="utf-8")
    assert source.count("__all__") == 1 and "face(__name__)" in source  # no second list beside it
    # a name that is also a module's name would be shadowed by the module once anything imports it
    modules = {p.name.removesuffix(".py") for p in (PACKAGE / stage).iterdir()}
    assert not set(names) & modules, set(names) & modules
    assert (PACKAGE / stage / "__init__.py").read_text(encoding="utf-8").startswith('"""')


def test_every_face_name_resolves_to_what_its_module_defines():
    import importlib
    import types

    for stage in STAGES:
        face = importlib.import_module(f"workbench.{stage}")
        for name, home in _face(stage)[1].items():
            value = getattr(face, name)
            assert not isinstance(value, types.ModuleType), f"{stage}.{name}"
            assert value is getattr(importlib.import_module(f"workbench.{stage}.{home}"), name), f"{stage}.{name}"
        assert set(face.__all__) <= set(dir(face)), stage


def test_notebooks_import_only_stage_faces():
    found, bad = 0, []
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            for node in ast.walk(ast.parse(src)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [module or ""]
                for m in modules:
                    if m.split(".")[0] != "workbench":
                        continue
                    found += 1
                    if len(m.split(".")) != 2 or m.split(".")[1].startswith("_"):
                        bad.append(f"{nb.name}: {m}")
            bad += [f"{nb.name}: __import__" for _ in range(src.count("__import__("))]
    assert found > 20 and not bad, bad


def _module_level_imports() -> dict[str, set[str]]:
    """workbench module -> the workbench modules it imports when it is imported, or when the type checker reads
    it: its top-level imports and those under ``if TYPE_CHECKING:``, not those inside functions (run on first use)."""
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
                nodes += [*node.body, *node.orelse]
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
    whichever module is imported first sees the other half-initialised), nor for the type checker."""
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
