"""Socket names: the Go helper's forms, and the 107-byte limit of a unix socket path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudra.kubeletplugin.serving.sockets import (
    MAX_SOCKET_PATH_BYTES,
    SocketPathError,
    dra_socket_path,
    plugin_data_dir,
    registration_socket_path,
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


