"""The `workbench` command line takes only the flags it names: no prefix matching (argparse's
``allow_abbrev``, on by default, read ``workbench proxy --admin-key K`` as ``--admin-key-file K``),
and every flag a help text or description mentions is a real flag of that subcommand."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from workbench.cli import build_parser

# Flags that help texts name on purpose although they belong to another program: the program the
# subcommand runs, named in the same text (`test_every_flag_a_help_text_names_exists` checks that).
OTHER_PROGRAMS_FLAGS = {
    ("sandbox-check", "--version"): "harness",  # "run a harness's --version in one real sandbox"
    ("train", "--title"): "opencode",  # opencode's own `run --title`
    ("eval", "--title"): "opencode",
    ("train", "--weight-transfer-config"): "vLLM",  # "a colocated vLLM started with --weight-transfer-config"
}

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subs.choices)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_every_flag_a_help_text_names_exists():
    """`workbench proxy --host`'s help once named `--admin-key`, a flag that no longer existed."""
    root = build_parser()
    missing, seen = [], set()
    for name, sub in _subcommands(root).items():
        have = _options(sub) | _options(root)
        for text in [sub.description or ""] + [a.help or "" for a in sub._actions]:
            for flag in FLAG.findall(text):
                seen.add((name, flag))
                program = OTHER_PROGRAMS_FLAGS.get((name, flag))
                if program is not None:
                    assert program in text, (name, flag, text)  # the text says whose flag it is
                elif flag not in have:
                    missing.append((name, flag, text))
    assert missing == []
    # the walk read the help texts: rollout's --proxy names --admin-key-file, and so does proxy's --host now
    assert {("rollout", "--admin-key-file"), ("proxy", "--admin-key-file")} <= seen


def test_no_parser_matches_abbreviations():
    root = build_parser()
    assert root.allow_abbrev is False
    assert {n: s.allow_abbrev for n, s in _subcommands(root).items() if s.allow_abbrev is not False} == {}


def test_proxy_admin_key_is_not_read_as_admin_key_file(capsys):
    """The issue's case: a key on the command line (readable by every user on the host) must be an
    error, not silently taken as the path of a key file."""
    argv = ["proxy", "--upstream", "http://127.0.0.1:1/v1", "--model", "m"]
    args = build_parser().parse_args([*argv, "--admin-key-file", "k.txt"])
    assert args.admin_key_file == "k.txt" and args.upstream == ["http://127.0.0.1:1/v1"]
    replicas = build_parser().parse_args([*argv, "--upstream", "http://127.0.0.1:2/v1"]).upstream
    assert replicas == ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]  # the first, then a replica
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*argv, "--admin-key", "K"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --admin-key K" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "function", "runs", "argv", "refused"),
    [
        ("workbench.cli.diff", "cli_diff", "diff_from_args", ["a", "b", "--js"], "--js")  # --json
    ],
)
def test_the_standalone_parsers_refuse_abbreviations(module, function, runs, argv, refused, capsys, monkeypatch):
    """`workbench.cli.diff.cli_diff` builds its own parser; an abbreviation is refused before anything runs (what would run is stubbed: an
    accepted ``--js`` once started a whole evaluation here)."""
    mod = importlib.import_module(module)

    def ran(*args, **kwargs):
        pytest.fail(f"{module} accepted {refused!r} and went on to run")

    monkeypatch.setattr(mod, runs, ran)
    with pytest.raises(SystemExit) as exc:
        getattr(mod, function)(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {refused}" in capsys.readouterr().err


def test_matrix_harness_all_means_every_registered_harness(monkeypatch, capsys):
    import workbench.evaluate.matrix as matrix
    from workbench.cli import commands
    from workbench.harnesses import HARNESSES

    seen = {}

    def fake_run_matrix(config, run_dir=None):
        seen["harnesses"] = config.harnesses
        return matrix.MatrixResult(Path("."), [], [])

    monkeypatch.setattr(matrix, "run_matrix", fake_run_matrix)
    args = build_parser().parse_args(["matrix", "--harness", "all", "--models", "tiny"])
    assert commands._cmd_matrix(args) == 0
    assert seen["harnesses"] == tuple(HARNESSES) and len(HARNESSES) >= 3
    assert build_parser().parse_args(["matrix", "--harnesses", "pi,codex"]).harnesses == "pi,codex"


def test_every_commands_help_reads_whole_sentences_without_doubled_percent_signs():
    """argparse %-formats option help, not descriptions: a `%%` escaped for one and printed by the other showed as
    "95%% intervals"; a docstring whose continuation lines were dropped cut help mid-sentence ("(short for")."""
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    assert "eval" in sub.choices and len(sub.choices) > 10
    for name, parser in sub.choices.items():
        text = parser.format_help()
        assert "%%" not in text, name
        for action in parser._actions:
            help_ = action.help or ""
            assert help_.count("(") == help_.count(")"), f"workbench {name} {action.option_strings}: {help_!r}"
