"""`--help` documents every option of every command: each has help text, and each that takes a
value shows its default (`runnercheck.stress.cli.main.HelpFormatter`, the one rule) or says it is required."""
from __future__ import annotations

import argparse
import importlib

import pytest

from runnercheck.stress.cli.main import COMMANDS, HelpFormatter, command_parser, main

# Options hidden on purpose: sizing knobs for tests and experiments, not part of a command's contract.
DELIBERATELY_HIDDEN = {
    ("verify", "--steps"), ("verify", "--runs"), ("verify", "--skip-chisq"), ("verify", "--no-coverage-gate"),
    ("verify", "--in-process"), ("mutants", "--in-process"),
}


def help_problems(name: str, parser: argparse.ArgumentParser) -> list[str]:
    """What ``parser``'s help leaves out: options without help text, options whose default is not shown."""
    formatter = parser._get_formatter()
    problems = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        flag = action.option_strings[-1] if action.option_strings else action.dest
        if action.help == argparse.SUPPRESS:
            if (name, flag) not in DELIBERATELY_HIDDEN:
                problems.append(f"{name} {flag}: hidden from --help")
            continue
        if not action.help:
            problems.append(f"{name} {flag}: no help text")
            continue
        text = formatter._expand_help(action)
        takes_value = action.option_strings and action.nargs != 0
        if takes_value and not action.required and "default" not in text and "required" not in text:
            problems.append(f"{name} {flag}: --help does not show its default ({action.default!r})")
    return problems


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_shows_its_default(name: str) -> None:
    parser = command_parser(name, importlib.import_module(COMMANDS[name].module))
    assert help_problems(name, parser) == []


def test_the_walk_catches_a_missing_help_text_and_an_unshown_default() -> None:
    planted = argparse.ArgumentParser(prog="runnercheck planted")  # argparse's own formatter: no defaults shown
    planted.add_argument("--steps", type=int, default=200, help="scheduler ticks")
    planted.add_argument("--model", default="micro")
    planted.add_argument("--secret", default=1, help=argparse.SUPPRESS)
    assert help_problems("planted", planted) == [
        "planted --steps: --help does not show its default (200)",
        "planted --model: no help text",
        "planted --secret: hidden from --help",
    ]
    fixed = argparse.ArgumentParser(prog="runnercheck planted", formatter_class=HelpFormatter)
    fixed.add_argument("--steps", type=int, default=200, help="scheduler ticks")
    assert help_problems("planted", fixed) == []


def test_help_shows_values_defaults_once_and_none_for_flags(capsys) -> None:
    assert main(["stress", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrap the columns
    assert "scheduler ticks (at most one step each) (default: 200)" in out
    assert "(default: out/stress)" in out and "(default: False)" not in out
    assert out.count("(default: MODEL-draft") == 1  # a help that states its own default gets no second one
    assert main(["mutants", "--help"]) == 0
    assert "(default: 0/1)" in " ".join(capsys.readouterr().out.split())  # --shard, as it is typed
