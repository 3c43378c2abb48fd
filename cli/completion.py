"""``gpudra completion bash|zsh``: shell completion generated from the argument parser itself,
so every subcommand, flag and choice the parser knows is completed, and nothing else."""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.cli.output import EXIT_STATUS_HELP

NAMES = ("gpudra", "kubectl-gpudra")
PATH_METAVARS = {"FILE", "DIR", "PATH"}


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()
    metavar: str = "VALUE"
    files: bool = False
    """The value is a file or folder."""
    repeatable: bool = False


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    """Subcommand words from the top (``()``: ``gpudra`` itself)."""
    help: str
    options: tuple[Option, ...]
    subcommands: tuple[Command, ...] = ()
    arguments: tuple[str, ...] = ()
    """Choices of a positional argument (``bash zsh``); empty with ``files``."""
    files: bool = False
    """Takes file arguments."""
    many: bool = False

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


def add_parser(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description="Print a completion script for gpudra and kubectl-gpudra. Load it in the "
                    "current shell with: source <(gpudra completion bash), or in zsh: "
                    "source <(gpudra completion zsh). To load it in every shell, add that line "
                    "to ~/.bashrc or ~/.zshrc, or save the zsh script as _gpudra in a folder "
                    "of $fpath.",
        epilog=EXIT_STATUS_HELP)
    parser.add_argument("shell", choices=sorted(SCRIPTS), help="the shell to complete in")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gpudra.cli.main import build_parser

    print(SCRIPTS[args.shell](describe(build_parser())), end="")
    return 0


# --- the parser, as data --------------------------------------------------------------

def _dynamic_choices(action: argparse.Action) -> tuple[str, ...]:
    """Values the parser checks later, not through ``choices``: profiles for --simulate."""
    if action.dest == "simulate":
        from gpudra.driver import sim

        return tuple(sim.node_profiles())
    return ()


def _text(text: str | None, action: argparse.Action | None = None) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    if action is not None:
        with contextlib.suppress(KeyError, TypeError, ValueError):  # as argparse expands it
            text = text % {**vars(action), "prog": ""}
    return re.sub(r"\s+", " ", text).strip()


def _option(action: argparse.Action) -> Option:
    takes_value = action.nargs != 0
    choices = tuple(str(c) for c in action.choices or ()) or _dynamic_choices(action)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    files = _is_path(action) or action.dest == "kubeconfig"
    return Option(tuple(action.option_strings), _text(action.help, action), takes_value,
                  choices, metavar, files, isinstance(action, argparse._AppendAction))


def _is_path(action: argparse.Action) -> bool:
    return action.type is Path or str(action.metavar or "").upper() in PATH_METAVARS


def describe(parser: argparse.ArgumentParser, path: tuple[str, ...] = (),
             help_text: str = "") -> Command:
    """The parser's commands, options and arguments (argparse keeps them in ``_actions``:
    there is no public accessor)."""
    options: list[Option] = []
    subcommands: list[Command] = []
    arguments: tuple[str, ...] = ()
    files = many = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: _text(choice.help) for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                subcommands.append(describe(subparser, (*path, name), helps.get(name, "")))
        elif action.option_strings:
            if action.help != argparse.SUPPRESS:
                options.append(_option(action))
        else:
            arguments = tuple(str(c) for c in action.choices or ())
            files = _is_path(action) or not arguments
            many = action.nargs in ("+", "*")
    return Command(path, help_text, tuple(options), tuple(subcommands), arguments, files, many)


# --- bash -----------------------------------------------------------------------------

def _bash_words(words: Iterator[str] | tuple[str, ...]) -> str:
    return " ".join(words)


def bash(root: Command) -> str:
    transitions = [f"{'/'.join(c.path[:-1])}/{c.path[-1]}" for c in root.walk() if c.path]
    lines = [
        "# bash completion for gpudra and kubectl-gpudra, generated by "
        "`gpudra completion bash`.",
        "# Load it with: source <(gpudra completion bash)",
        "_gpudra() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local command="" word i',
        "    # the subcommand path so far: words that name a subcommand of the one before",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "$command/$word" in',
        f"            {'|'.join(transitions)})",
        '                command="${command:+$command/}$word" ;;',
        "        esac",
        "    done",
        '    local candidates=""',
        '    case "$command" in',
    ]
    for command in root.walk():
        lines.append(f'        "{"/".join(command.path)}")')
        valued = [o for o in command.options if o.takes_value]
        if valued:
            lines.append('            case "$prev" in')
            for option in (o for o in valued if o.choices):
                lines += [f"                {'|'.join(option.flags)})",
                          "                    COMPREPLY=($(compgen -W "
                          f'"{_bash_words(option.choices)}" -- "$cur"))',
                          "                    return ;;"]
            free = [f for o in valued if not o.choices for f in o.flags]
            if free:
                # nothing offered, so bash falls back to file names (complete -o default)
                lines.append(f"                {'|'.join(free)}) return ;;")
            lines.append("            esac")
        flags = _bash_words(f for o in command.options for f in o.flags)
        names = _bash_words(tuple(c.path[-1] for c in command.subcommands) + command.arguments)
        if command.files and not command.subcommands:
            lines.append('            [[ "$cur" == -* ]] || return')
        lines.append(f'            candidates="{" ".join(filter(None, (flags, names)))}" ;;')
    lines += [
        "    esac",
        '    COMPREPLY=($(compgen -W "$candidates" -- "$cur"))',
        "}",
        f"complete -o default -F _gpudra {' '.join(NAMES)}",
    ]
    return "\n".join(lines) + "\n"


# --- zsh ------------------------------------------------------------------------------

def _zq(text: str) -> str:
    """Single-quoted for zsh."""
    return "'" + text.replace("'", "'\\''") + "'"


def _zdesc(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def _zsh_option(option: Option) -> list[str]:
    specs = []
    for flag in option.flags:
        spec = f"{flag}[{_zdesc(option.help)}]"
        if option.takes_value:
            # --long=: the value may follow as the next word or after "="; -s+: attached too
            spec = (f"{flag}=[{_zdesc(option.help)}]" if flag.startswith("--")
                    else f"{flag}+[{_zdesc(option.help)}]")
            action = (f"({' '.join(option.choices)})" if option.choices
                      else "_files" if option.files else " ")
            spec += f":{option.metavar.lower().replace(':', ' ')}:{action}"
        specs.append(_zq(("*" if option.repeatable else "") + spec))
    return specs


def _zsh_function(command: Command) -> str:
    return "_" + "_".join(("gpudra", *command.path)).replace("-", "_")


def zsh(root: Command) -> str:
    lines = [
        "#compdef gpudra kubectl-gpudra",
        "# zsh completion for gpudra and kubectl-gpudra, generated by `gpudra completion zsh`.",
        "# Load it with: source <(gpudra completion zsh), or save it as _gpudra in a folder of",
        "# $fpath.",
    ]
    for command in root.walk():
        specs = [s for o in command.options for s in _zsh_option(o)]
        lines.append(f"{_zsh_function(command)}() {{")
        if command.subcommands:
            lines.append('  local curcontext="$curcontext" state line')
            specs += ["'1:command:->command'", "'*::argument:->argument'"]
            lines.append("  _arguments -C -s \\")
        else:
            if command.arguments:
                specs.append(_zq(f"{'*' if command.many else '1'}:argument:"
                                 f"({' '.join(command.arguments)})"))
            elif command.files:
                specs.append(_zq(f"{'*' if command.many else '1'}:file:_files"))
            lines.append("  _arguments -s \\")
        lines += [f"    {s} \\" for s in specs[:-1]] + [f"    {specs[-1]}"]
        if command.subcommands:
            items = " ".join(_zq(f"{c.path[-1]}:{_zdesc(c.help)}") for c in command.subcommands)
            title = " ".join(("gpudra", *command.path, "command"))
            lines += [
                "  case $state in",
                f"    command) local -a commands=({items})",
                f"      _describe -t commands {_zq(title)} commands ;;",
                "    argument)",
                "      case $line[1] in",
                *[f"        {c.path[-1]}) {_zsh_function(c)} ;;" for c in command.subcommands],
                "      esac ;;",
                "  esac",
            ]
        lines.append("}")
    lines += [
        'if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then',
        '  _gpudra "$@"',
        "else",
        f"  compdef _gpudra {' '.join(NAMES)}",
        "fi",
    ]
    return "\n".join(lines) + "\n"


SCRIPTS: dict[str, Callable[[Command], str]] = {"bash": bash, "zsh": zsh}
