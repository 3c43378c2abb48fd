"""The CEL parser's table cache is a pickle that Lark loads: a cache *file* that is not a
plain file of this user's, writable by nobody else, is never loaded (nor written through),
whatever its directory. The real ``gpudra validate`` process, with its cache home planted."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lark
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAIM = ROOT / "examples" / "gpu-by-product"


class _Payload:
    """Unpickling it creates ``marker``: what a planted pickle could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return os.mkdir, (str(self.marker),)


def cache_file(home: Path) -> Path:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return home / "gpudra" / f"cel-grammar-lark{lark.__version__}-py{version}.cache"


def evil_pickle(path: Path, marker: Path) -> bytes:
    # Lark reads one line (a hash), then unpickles whatever follows, match or not.
    content = b"0" * 64 + b"\n" + pickle.dumps(_Payload(marker))
    path.write_bytes(content)
    return content


def validate(home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gpudra.cli.main", "validate", str(CLAIM)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


def private_home(tmp_path: Path) -> Path:
    home = tmp_path / "cache"
    (home / "gpudra").mkdir(parents=True, mode=0o700)
    home.chmod(0o700)
    return home


def plant_symlink(home: Path, tmp_path: Path, marker: Path) -> Path:
    target = tmp_path / "elsewhere.pickle"
    evil_pickle(target, marker)
    cache_file(home).symlink_to(target)
    return target


def plant_writable(home: Path, tmp_path: Path, marker: Path) -> Path:
    path = cache_file(home)
    evil_pickle(path, marker)
    path.chmod(0o666)  # anybody could have put this content there
    return path


def plant_foreign(home: Path, tmp_path: Path, marker: Path) -> Path:
    path = cache_file(home)
    evil_pickle(path, marker)
    os.chown(path, 65534, 65534)  # another user's file (nobody)
    return path


@pytest.mark.parametrize("plant", [
    plant_symlink, plant_writable,
    pytest.param(plant_foreign, marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="only root can give a file to another user")),
], ids=["symlink", "writable-by-others", "another-owner"])
def test_a_cache_file_that_is_not_ours_alone_is_never_loaded(tmp_path, plant):
    home = private_home(tmp_path)
    marker = tmp_path / "pickle-ran"
    planted = plant(home, tmp_path, marker)
    before = planted.read_bytes() if not planted.is_symlink() else None
    target = planted.resolve() if planted.is_symlink() else None
    target_bytes = target.read_bytes() if target else None
    done = validate(home)
    assert done.returncode == 0, done.stderr
    assert "OK: 1 Pod, 1 ResourceClaim" in done.stdout
    assert not marker.exists()  # the pickle was not loaded
    if target is not None:
        assert target.read_bytes() == target_bytes  # nor written through the symlink
    # the cache works again: the file is now a plain file of ours, not group/other-writable
    info = cache_file(home).lstat()
    assert not cache_file(home).is_symlink() and info.st_uid == os.geteuid()
    assert not info.st_mode & 0o022
    assert before is None or cache_file(home).read_bytes() != before


def test_a_good_cache_file_is_still_used(tmp_path):
    home = private_home(tmp_path)
    assert validate(home).returncode == 0
    stamp = cache_file(home).stat().st_mtime_ns
    for trees in (home / "gpudra").glob("cel-trees-*"):
        for tree in trees.iterdir():
            tree.unlink()  # else nothing is parsed
    assert validate(home).returncode == 0
    assert cache_file(home).stat().st_mtime_ns == stamp  # read, not rebuilt
