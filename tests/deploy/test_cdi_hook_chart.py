"""The chart puts the image's ``nvidia-cdi-hook`` on the host (as NVIDIA's chart does) and
names that copy to the daemon, unless ``cdiHookPath`` names a hook already there."""

from __future__ import annotations

import pytest

pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

from tests.deploy.test_chart import SIMULATE, container, daemon

COPY = "/var/lib/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook"


def test_the_image_hook_is_copied_to_the_path_the_daemon_names():
    spec = daemon()
    (install,) = [c for c in spec["initContainers"] if c["name"] == "install-cdi-hook"]
    plugin = spec["containers"][0]
    assert install["image"] == plugin["image"]
    # Copied beside itself, then renamed: a runtime never runs a half-written hook.
    assert install["command"][:2] == ["/bin/sh", "-c"]
    assert "install -D -m 0755 /usr/local/bin/nvidia-cdi-hook" in install["command"][2]
    assert 'mv -f "$0.tmp" "$0"' in install["command"][2]
    assert install["command"][3] == COPY
    assert f"--cdi-hook-path={COPY}" in plugin["args"]
    # The copy lands in the kubelet plugins directory, a host path mounted at the same path.
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = install["volumeMounts"]
    assert COPY.startswith(mount["mountPath"] + "/")
    assert volumes[mount["name"]]["hostPath"]["path"] == mount["mountPath"]
    assert not mount.get("readOnly")
    # First, so the hook is on the host before the daemon writes a spec naming it.
    assert spec["initContainers"][0]["name"] == "install-cdi-hook"


@pytest.mark.parametrize("key", ["cdiHookPath", "nvidiaCDIHookPath"])
def test_a_named_hook_is_used_as_it_is(key):
    values = {key: "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}
    spec = daemon(values)
    assert "install-cdi-hook" not in [c["name"] for c in spec["initContainers"]]
    assert "--cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook" in container(values)["args"]


def test_a_simulated_node_copies_nothing():
    assert "initContainers" not in daemon(SIMULATE)
    assert not any(a.startswith("--cdi-hook-path") for a in container(SIMULATE)["args"])


def test_a_custom_plugins_dir_moves_the_copy():
    values = {"kubeletPlugin": {"kubeletPluginsDirectoryPath": "/data/kubelet/plugins"}}
    spec = daemon(values)
    (install,) = [c for c in spec["initContainers"] if c["name"] == "install-cdi-hook"]
    assert install["command"][3] == "/data/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook"
    assert "--cdi-hook-path=/data/kubelet/plugins/gpu.nvidia.com/bin/nvidia-cdi-hook" in \
        spec["containers"][0]["args"]
