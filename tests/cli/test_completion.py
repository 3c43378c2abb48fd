"""``gpudra completion bash|zsh``: scripts generated from the parser, run in real shells."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpudra.cli.completion import describe
from gpudra.cli.main import COMMANDS, build_parser, main
from gpudra.driver import sim


def script(capsys, shell: str) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


def bash_complete(path, line: str) -> list[str]:
    """What bash offers after ``line`` (a trailing space starts a new word)."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    array = " ".join(f"'{w}'" for w in words)
    program = (f"source {path}\nCOMP_WORDS=({array})\nCOMP_CWORD={len(words) - 1}\n"
               '_gpudra\nprintf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program],
                          capture_output=True, text=True, check=True, timeout=30)
    return [w for w in done.stdout.splitlines() if w]


@pytest.fixture
def bash_script(tmp_path, capsys):
    path = tmp_path / "gpudra.bash"
    path.write_text(script(capsys, "bash"))
    return path


def test_the_parser_model_has_every_subcommand_and_flag():
    root = describe(build_parser())
    assert [c.path[-1] for c in root.subcommands] == list(COMMANDS)
    (explain,) = [c for c in root.subcommands if c.path == ("explain",)]
    flags = {f for o in explain.options for f in o.flags}
    assert {"--simulate", "--kubeconfig", "--context", "-n", "--namespace", "-o",
            "--output"} <= flags
    assert explain.files and explain.many
    (output,) = [o for o in explain.options if "-o" in o.flags]
    assert output.choices == ("table", "wide", "json", "yaml")
    (simulate,) = [o for o in explain.options if "--simulate" in o.flags]
    assert simulate.choices == tuple(sim.node_profiles())


def test_bash_script_names_every_subcommand_and_is_valid_bash(bash_script):
    text = bash_script.read_text()
    for command in COMMANDS:
        assert command in text
    assert "complete -o default -F _gpudra gpudra kubectl-gpudra" in text
    subprocess.run(["bash", "-n", str(bash_script)], check=True)


def test_bash_completes_subcommands_flags_and_choices(bash_script):
    assert bash_complete(bash_script, "gpudra ") == [
        "-h", "--help", "--version", *COMMANDS]
    assert bash_complete(bash_script, "gpudra ex") == ["explain"]
    assert {"xid", "gpu-lost"} <= set(bash_complete(bash_script, "gpudra sim "))
    assert bash_complete(bash_script, "gpudra inventory --ty") == ["--type"]
    assert bash_complete(bash_script, "gpudra inventory -o ") == ["table", "wide", "json",
                                                                  "yaml"]
    assert bash_complete(bash_script, "gpudra explain pod.yaml --simulate dgx-h") == [
        "dgx-h100"]
    assert bash_complete(bash_script, "gpudra completion ") == ["-h", "--help", "bash", "zsh"]
    # file arguments and free values: nothing offered, so bash completes file names
    assert bash_complete(bash_script, "gpudra explain ex") == []
    assert bash_complete(bash_script, "gpudra explain --kubeconfig ") == []


def test_bash_follows_nested_subcommands(bash_script):
    assert "--xid" in bash_complete(bash_script, "gpudra sim xid --")
    assert "--xid" not in bash_complete(bash_script, "gpudra sim gpu-lost --")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_is_valid_and_registers_both_names(tmp_path, capsys):
    path = tmp_path / "_gpudra"
    path.write_text(script(capsys, "zsh"))
    subprocess.run(["zsh", "-n", str(path)], check=True)
    done = subprocess.run(
        ["zsh", "-f", "-c", f"autoload -U compinit; compinit -u -d {tmp_path}/dump; "
                            f"source {path}; print -- $_comps[gpudra] $_comps[kubectl-gpudra]"],
        capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout.split() == ["_gpudra", "_gpudra"]


def test_zsh_script_names_every_subcommand_and_its_flags(capsys):
    text = script(capsys, "zsh")
    assert text.startswith("#compdef gpudra kubectl-gpudra\n")
    for command in COMMANDS:
        assert f"        {command}) _gpudra_{command.replace('-', '_')} ;;" in text
    assert "'--output=[" in text and ":(table wide json yaml)'" in text
    assert "'*--node=[" in text  # repeatable
    assert "'*:file:_files'" in text


def test_unknown_shell_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["completion", "fish"])
    assert done.value.code == 2
