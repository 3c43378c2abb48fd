"""``--help`` is plain text, every ``gpudra node`` flag has its environment variable, and
``--version`` names the installed distribution's version."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
from collections.abc import Iterator

import pytest

from gpudra.cli.main import build_parser, main

# reStructuredText that leaks when a module docstring becomes a description
MARKUP = re.compile(r"``|:(class|func|meth|mod|attr):`")


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _texts(parser: argparse.ArgumentParser) -> Iterator[str]:
    yield from (parser.description or "", parser.epilog or "")
    for action in parser._actions:
        yield action.help or ""
        if isinstance(action, argparse._SubParsersAction):
            yield from (choice.help or "" for choice in action._choices_actions)


def test_help_texts_are_plain_text():
    leaks = [f"{parser.prog}: {text[:60]!r}" for parser in _parsers(build_parser())
             for text in _texts(parser) if MARKUP.search(text)]
    assert not leaks


def test_every_help_page_renders_and_states_the_exit_statuses(capsys):
    for parser in _parsers(build_parser()):
        words = parser.prog.split()[1:]
        with pytest.raises(SystemExit) as done:
            main([*words, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: {parser.prog}")
        if words in ([], ["inventory"], ["explain"], ["validate"]):
            assert "exit status: 0 ok; 1 not allocatable, invalid input found" in " ".join(
                out.split())


def test_every_node_flag_names_its_environment_variable():
    (node,) = [p for p in _parsers(build_parser()) if p.prog == "gpudra node"]
    missing = [action.option_strings[-1] for action in node._actions
               if action.option_strings and action.dest != "help"
               and not re.search(r"\benv [A-Z_]+", action.help or "")]
    assert not missing


def test_shutdown_grace_falls_back_to_its_environment_variable(monkeypatch):
    monkeypatch.setenv("SHUTDOWN_GRACE", "2.5")
    assert build_parser("node").parse_args(["node"]).shutdown_grace == 2.5
    monkeypatch.delenv("SHUTDOWN_GRACE")
    assert build_parser("node").parse_args(["node"]).shutdown_grace == 10.0
    assert build_parser("node").parse_args(
        ["node", "--shutdown-grace", "1"]).shutdown_grace == 1.0


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"gpudra {importlib.metadata.version('gpudra')}\n"
