"""The committed stubs in api/proto/gen are exactly what the pinned protoc makes of the sources."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpudra.api.proto import generate


def test_committed_stubs_match_the_sources() -> None:
    problems = generate.check()
    assert problems == [], "stale generated stubs; run: python -m gpudra.api.proto.generate\n" + (
        "\n".join(problems)
    )


def test_generated_tree_is_importable_as_gpudra_packages() -> None:
    tree = generate.render()
    grpc_modules = [name for name in tree if name.endswith("_pb2_grpc.py")]
    assert len(grpc_modules) == 5
    for name in grpc_modules:
        package = "gpudra.api.proto.gen." + name.rsplit("/", 1)[0].replace("/", ".")
        pb2 = name.rsplit("/", 1)[1].removesuffix("_grpc.py")
        assert f"from {package} import {pb2} as ".encode() in tree[name], name
    # every directory is a regular package, so setuptools and mypy see it
    for name in tree:
        parent = name.rsplit("/", 1)[0] if "/" in name else ""
        assert (f"{parent}/__init__.py" if parent else "__init__.py") in tree


def _tampered_copy(tmp_path: Path) -> Path:
    """A freshly generated tree (independent of the committed one) with three kinds of damage."""
    gen = tmp_path / "gen"
    for name, content in generate.render().items():
        (gen / name).parent.mkdir(parents=True, exist_ok=True)
        (gen / name).write_bytes(content)
    stub = gen / "dra" / "v1" / "dra_pb2_grpc.py"
    stub.write_text(stub.read_text().replace("NodePrepareResources", "NodePrepareResource"))
    (gen / "health" / "v1" / "health_pb2.pyi").unlink()
    (gen / "dra" / "v1alpha3").mkdir()
    (gen / "dra" / "v1alpha3" / "__init__.py").write_text("")
    (gen / "dra" / "v1alpha3" / "api_pb2.py").write_text("# left over\n")
    return gen


def test_check_reports_every_kind_of_difference(tmp_path: Path) -> None:
    problems = generate.check(_tampered_copy(tmp_path))
    heads = sorted(p.splitlines()[0] for p in problems)
    assert heads == [
        "differs: dra/v1/dra_pb2_grpc.py",
        "missing: health/v1/health_pb2.pyi",
        "stale (no source generates it): dra/v1alpha3/__init__.py",
        "stale (no source generates it): dra/v1alpha3/api_pb2.py",
    ]
    differs = next(p for p in problems if p.startswith("differs:"))
    assert "+++ regenerated/dra/v1/dra_pb2_grpc.py" in differs


def test_check_command_fails_on_a_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(generate, "GEN_DIR", _tampered_copy(tmp_path))
    assert generate.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "4 generated file(s)" in err
    assert "differs: dra/v1/dra_pb2_grpc.py" in err


def test_write_repairs_a_tampered_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _tampered_copy(tmp_path)
    monkeypatch.setattr(generate, "GEN_DIR", gen)
    assert generate.main([]) == 0
    assert "4 file(s) changed" in capsys.readouterr().out
    assert not (gen / "dra" / "v1alpha3").exists()
    assert generate.check(gen) == []
    assert generate.main(["--check"]) == 0


def test_wrong_grpcio_tools_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generate.importlib.metadata, "version", lambda _name: "1.76.0")
    with pytest.raises(generate.GenerateError, match=r"grpcio-tools 1\.76\.0 .*==1\.85\.1"):
        generate.render()
    assert generate.main(["--check"]) == 2


def test_sources_outside_the_generated_package_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dra").mkdir()
    (tmp_path / "dra" / "api.proto").write_text('syntax = "proto3";\n')
    with pytest.raises(generate.GenerateError, match=r"dra/api\.proto"):
        generate.proto_sources(tmp_path)


def test_module_entry_point_checks_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpudra.api.proto.generate", "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout
