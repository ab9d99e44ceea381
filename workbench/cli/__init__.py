"""The command line: ``workbench <command>`` (``python -m workbench``), each command a thin client of the stages.

    workbench rollout --task easy/3 --out runs/r0           # one agent run through the capture proxy
    workbench train --model qwen-coder --tasks 'easy-train[:2]' --steps 1 --group-size 4
    workbench notebooks run --params default               # the five notebooks headless (`make run`)

Private modules: ``commands`` (`main`, `build_parser`: every subcommand), ``services`` (the long-running
ones: engine, proxy, assets, checks), ``flags`` (command-line options made from a config dataclass),
``notebooks`` (papermill runs of the notebooks, their parameters checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench._lazy import face


__all__, __getattr__, __dir__ = face(__name__)

if TYPE_CHECKING:
    from workbench.cli.commands import build_parser, main
    from workbench.cli.flags import add_config_arguments, given_fields
    from workbench.cli.notebooks import Notebook, NotebookError, open_notebook
