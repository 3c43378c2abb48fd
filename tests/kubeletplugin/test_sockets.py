"""Socket names: the Go helper's forms, and the 107-byte limit of a unix socket path; the
modes of what the daemon creates for its sockets, whatever the umask."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.kubeletplugin.sockets import (
    MAX_SOCKET_PATH_BYTES,
    SocketPathError,
    binding,
    dra_socket_path,
    make_dirs,
    plugin_data_dir,
    registration_socket_path,
    restrict_dir,
)

UID = "ad4af911-5bcd-47c5-a554-f35cea869472"
# Expected hashes computed with openssl, not Python:
#   printf %s $UID | openssl dgst -sha256 -binary | head -c 8 | base64 | tr '+/' '-_' | tr -d =
UID_HASH = "Jk8-oymVURI"
LONG_DRIVER = "a" * 22 + ".example.org"  # 34 bytes, as in the example driver's chart test
#   printf '%s\0%s' "$LONG_DRIVER" "$UID" | openssl dgst -sha256 -binary | head -c 16 | ...
DRIVER_UID_HASH = "qep1tvE6C6xIANnKbYi6Jg"


def test_default_paths():
    assert registration_socket_path("/var/lib/kubelet/plugins_registry", "gpu.nvidia.com") == Path(
        "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock")
    assert dra_socket_path("/var/lib/kubelet/plugins", "gpu.nvidia.com") == Path(
        "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
    assert plugin_data_dir("/var/lib/kubelet/plugins", "gpu.nvidia.com") == Path(
        "/var/lib/kubelet/plugins/gpu.nvidia.com")


def test_rolling_update_prefers_the_readable_name():
    assert registration_socket_path("/var/lib/kubelet/plugins_registry", "gpu.nvidia.com",
                                    UID).name == f"gpu.nvidia.com-{UID}-reg.sock"
    assert dra_socket_path("/var/lib/kubelet/plugins", "gpu.nvidia.com", UID) == Path(
        f"/var/lib/kubelet/plugins/gpu.nvidia.com/dra-{UID}.sock")


def test_rolling_update_falls_back_to_the_hashed_uid():
    path = registration_socket_path("/var/lib/kubelet/plugins_registry", LONG_DRIVER, UID)
    assert path.name == f"{LONG_DRIVER}-{UID_HASH}-reg.sock"


def test_rolling_update_shortest_form_hashes_driver_and_uid():
    path = registration_socket_path("/" + "r" * 59, LONG_DRIVER, UID)
    assert path.name == f"dra-{DRIVER_UID_HASH}-reg.sock"


@pytest.mark.parametrize(("dir_length", "form", "path_bytes"), [
    # The example driver's chart test table (driver of 34 bytes); Go's helper accepts 108
    # bytes, grpc refuses more than 107, so at 52 we already take the shortest form.
    (51, "uid-hash", 107),
    (52, "driver-uid-hash", 88),
    (53, "driver-uid-hash", 89),
    (71, "driver-uid-hash", 107),
])
def test_rolling_update_first_form_that_fits(dir_length, form, path_bytes):
    path = registration_socket_path("/" + "r" * (dir_length - 1), LONG_DRIVER, UID)
    assert len(str(path).encode()) == path_bytes <= MAX_SOCKET_PATH_BYTES
    assert path.name.startswith("dra-") == (form == "driver-uid-hash")


def test_a_very_long_driver_name_gets_the_shortest_form():
    driver = "a" * 63 + ".example.com"
    path = registration_socket_path("/var/lib/kubelet/plugins_registry", driver, UID)
    assert path.name.startswith("dra-") and path.name.endswith("-reg.sock")
    assert driver not in path.name


def test_no_form_fits_is_a_clear_error():
    with pytest.raises(SocketPathError, match=r"108 bytes.*at most 107.*shorter registrar dir"):
        registration_socket_path("/" + "r" * 71, LONG_DRIVER, UID)


def test_a_too_long_dra_socket_is_a_clear_error():
    with pytest.raises(SocketPathError, match=r"DRA socket path .* at most 107"):
        dra_socket_path("/" + "p" * 60, LONG_DRIVER, UID)


def test_the_length_check_sees_the_cleaned_path():
    # "/./" and a trailing slash cost nothing, as with Go's path.Join.
    messy = registration_socket_path("/" + "r" * 50 + "/./", LONG_DRIVER, UID)
    assert messy == registration_socket_path("/" + "r" * 50, LONG_DRIVER, UID)


def test_names_differ_per_driver_and_pod():
    names = {
        registration_socket_path("/" + "r" * 59, driver, uid).name
        for driver in (LONG_DRIVER, LONG_DRIVER.replace("a", "b"))
        for uid in (UID, "11111111-2222-3333-4444-555555555555")
    }
    assert len(names) == 4
    assert all(name.startswith("dra-") for name in names)


@pytest.mark.parametrize("driver", ["", ".", "..", "gpu/nvidia.com"])
def test_a_driver_name_that_is_not_one_file_name_is_refused(driver):
    with pytest.raises(SocketPathError, match="driver name"):
        registration_socket_path("/r", driver)



@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_make_dirs_gives_each_directory_it_creates_the_mode_and_leaves_the_others(tmp_path):
    tmp_path.chmod(0o755)
    make_dirs(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o750] * 3
    assert mode(tmp_path) == 0o755
    make_dirs(tmp_path / "a", mode=0o700)  # exists: unchanged
    assert mode(tmp_path / "a") == 0o750


@pytest.mark.usefixtures("open_umask")
def test_restrict_dir_takes_away_what_is_beyond_the_mode_only_from_its_own_dirs(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir(0o777)
    restrict_dir(ours)
    assert mode(ours) == 0o750
    ours.chmod(0o700)
    restrict_dir(ours)  # never widens
    assert mode(ours) == 0o700
    if os.geteuid() == 0:  # a directory of another owner (only root can make one here)
        theirs = tmp_path / "theirs"
        theirs.mkdir(0o777)
        os.chown(theirs, 65534, 65534)
        restrict_dir(theirs)
        assert mode(theirs) == 0o777


@pytest.mark.usefixtures("open_umask")
def test_binding_makes_a_socket_0600_under_umask_000_and_restores_the_umask(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        with binding(path):
            sock.bind(str(path))
            assert mode(path) & 0o177 == 0  # never more open, not even before the chmod
        assert mode(path) == 0o600
    assert os.umask(0) == 0  # restored (the fixture's 000)
