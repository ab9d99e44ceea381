"""Command-line flags generated from a config dataclass: every documented field is reachable.

One flag per field, named after it (``group_size`` -> ``--group-size``), typed from its annotation
(``bool`` -> ``--x/--no-x``, ``Literal`` -> choices, ``X | None`` -> X, ``tuple[str, ...]`` -> a
comma-separated list), its help taken from the dataclass docstring's ``name: text`` lines. Flags
are `argparse.SUPPRESS`-defaulted, so the namespace holds only what was given: a preset (e.g.
`TrainConfig.baseline`) can be applied first and explicit flags override it. Hand-written argparse
rather than a library such as tyro: the configs are flat, and the generated flags must keep the
names the README and the notebooks already use (``aliases``).

    add_config_arguments(parser, TrainConfig, aliases={"learning_rate": ["--lr"]}, exclude={"tasks"})
    config = TrainConfig(**given_fields(args, TrainConfig))
"""

from __future__ import annotations

import argparse
import re
import types
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["add_config_arguments", "given_fields", "field_docs"]


def field_docs(cls: type) -> dict[str, str]:
    """``name: help`` lines of a dataclass docstring (the "Attributes:" block), continuation lines joined."""
    docs: dict[str, str] = {}
    current = None
    for line in (cls.__doc__ or "").splitlines():
        m = re.match(r"^ {8}(\w[\w /]*): (.+)$", line)  # a continuation line is indented 12
        if m:
            names = [n.strip() for n in m.group(1).split("/")]
            for n in names:
                docs[n] = m.group(2).strip()
            current = names
        elif current and re.match(r"^ {12}\S", line):
            for n in current:
                docs[n] += " " + line.strip()
        else:
            current = None
    return docs


def _parse_tuple(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_config_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    aliases: dict[str, list[str]] | None = None,
    exclude: set[str] | frozenset[str] = frozenset(),
) -> argparse.ArgumentParser:
    """One flag per field of the dataclass `cls` (but `exclude`); `aliases` adds extra flag names."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints, docs = get_type_hints(cls), field_docs(cls)
    for f in fields(cls):
        if f.name in exclude or not f.init:
            continue
        names = ["--" + f.name.replace("_", "-"), *(aliases or {}).get(f.name, [])]
        t = hints[f.name]
        if get_origin(t) in (Union, types.UnionType):  # X | None
            t = next(a for a in get_args(t) if a is not type(None))
        default = f.default if f.default is not MISSING else None
        # argparse %-formats help strings: a docstring's "17% of rows" broke every --help
        help_ = f"{docs.get(f.name, '')} (default: {default})".strip().replace("%", "%%")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_}
        if t is bool:
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
        elif get_origin(t) is Literal:
            parser.add_argument(*names, choices=get_args(t), **kw)
        elif get_origin(t) is tuple:
            parser.add_argument(*names, type=_parse_tuple, metavar="A,B,...", **kw)
        elif t in (int, float, str):
            parser.add_argument(*names, type=t, **kw)
        else:
            continue  # nested configs (e.g. SandboxLimits) are not flags
    return parser


def given_fields(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` the command line set (flags added by `add_config_arguments`)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names}
