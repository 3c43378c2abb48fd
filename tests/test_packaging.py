"""The wheel works without the checkout: ``gpudra --help`` and ``gpudra demo`` from a fresh venv.

Offline: the wheel is built with this venv's setuptools (no build isolation, no index), and
the fresh venv gets only the wheel; a ``.pth`` file lends it this venv's site-packages for
the dependencies. A ``.pth`` line only adds a directory to ``sys.path`` (the editable
install's own ``.pth`` hook there is not run), and every command runs from an empty
directory without ``PYTHONPATH``, so nothing of the checkout can be imported.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str | Path], cwd: Path, timeout: float = 120) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args}\n{done.stdout}{done.stderr}"
    return done.stdout


def _sources(dest: Path) -> Path:
    """What the build reads, copied, so the build's own files stay out of the checkout."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in config["package-dir"].values():
        shutil.copytree(ROOT / folder, dest / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _fresh_venv(path: Path, wheel: Path) -> Path:
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
          "--no-index", wheel], cwd=path)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=path).strip())
    # wherever this interpreter finds its distributions, except a build's leftovers in ROOT
    ours = {str(d.locate_file("")) for d in importlib.metadata.distributions()} - {str(ROOT)}
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return path / "bin"


def test_installed_wheel_runs_the_demo_without_the_checkout(tmp_path):
    src = _sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--no-index", "--wheel-dir", wheels, src], cwd=tmp_path)
    (wheel,) = wheels.glob("gpudra-*.whl")
    bin_dir = _fresh_venv(tmp_path / "venv", wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = _run([bin_dir / "python", "-c", "import sys; from gpudra.cli import package_data; "
                  "print(package_data.__file__, package_data.folder('gpudra.examples')); "
                  "print(*sys.path, sep='\\n')"], cwd=elsewhere)
    code, examples = where.splitlines()[0].split()
    assert code.startswith(str(tmp_path / "venv")), where
    assert examples.startswith(str(tmp_path / "venv")), where
    assert str(ROOT) not in where.splitlines()[1:], where

    assert "demo" in _run([bin_dir / "gpudra", "--help"], cwd=elsewhere)
    out = _run([bin_dir / "gpudra", "demo"], cwd=elsewhere)
    assert "published 9 ResourceSlices" in out
    for scenario in ("single-gpu", "mig-1g-dynamic", "two-mig-same-gpu", "exclusive-compute",
                     "mps"):
        line = next(x for x in out.splitlines() if scenario in x)
        assert "→ prepared" in line, line
    assert "CDI specs left: 0" in out and "sockets left behind: none" in out


def test_the_image_build_copies_every_folder_the_wheel_is_made_of():
    """The Dockerfile builds the wheel from an allowlisted context: a new top-level package
    folder missing from either list would break ``docker build`` (no Docker engine here)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for folder in config["package-dir"].values():
        copied = [line for line in dockerfile.splitlines()
                  if line.startswith(f"COPY {folder}/")]
        assert copied, f"Dockerfile does not COPY {folder}/"
        assert any(line.startswith(f"!{folder}/") for line in allowed), (
            f".dockerignore keeps {folder}/ out of the build context")
