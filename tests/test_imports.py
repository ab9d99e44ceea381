"""The light clients stay light: importing the trainer, the rollout runner or the proxy client must not
import OpenEnv's capture server (gradio, pandas, fastmcp: ~3,400 modules, 7-10 s here)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["workbench.train", "workbench.rollout", "workbench.capture_client",
                                    "workbench.evaluate", "workbench.turns", "workbench.verify"])
def test_importing_does_not_pull_openenvs_server(module):
    code = (f"import sys; import {module}; heavy = sorted(m for m in ('gradio', 'pandas', 'openenv', 'fastmcp') "
            "if m in sys.modules); print(heavy, len(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    heavy, count = out.stdout.rsplit(" ", 1)
    assert heavy == "[]", (module, out.stdout)
    assert int(count) < 1500, (module, count)


def test_every_subcommands_help_renders():
    """argparse %-formats help text: one docstring's "17% of rows" once broke `workbench train --help`."""
    import argparse

    from workbench.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"train", "eval", "rollout", "verify"} <= set(subs.choices)
    for name, sub in subs.choices.items():
        text = sub.format_help()
        assert name in text and "usage:" in text
    assert "--shared-prefix {auto,on,off}" in subs.choices["train"].format_help()


def test_the_package_names_its_stages_and_loads_them_on_first_use():
    code = ("import sys, workbench; before = sorted(m for m in sys.modules if m.startswith('workbench.')); "
            "names = {n: getattr(workbench, n).__module__ for n in workbench.__all__}; "
            "print(before); print(names)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    before, names = out.stdout.splitlines()
    assert before == "[]"
    assert "'load_task': 'workbench.tasks'" in names and "'GRPORun': 'workbench.train'" in names
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        import workbench
        workbench.nothing  # noqa: B018
