"""CDI specs per claim: content, cdiVersion selection, names, files."""

from __future__ import annotations

import json
import os

import pytest

from gpudra.driver.cdi import (
    CdiDevice,
    CdiError,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    build_claim_spec,
    list_claim_specs,
    minimum_version,
    remove_spec,
    spec_file_name,
    spec_path,
    write_spec,
)

DRIVER = "gpu.nvidia.com"
UID = "0b5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"  # starts with a digit, as claim UIDs can
LETTER_UID = "fb5d2f1e-7c4a-4e2b-9f61-3a8d5c0e7b12"


# --- cdiVersion ---------------------------------------------------------------------------


def minimal(name="gpu-0", kind="k8s.gpu.nvidia.com/claim", **edits):
    return {"kind": kind, "devices": [{"name": name, "containerEdits": {"env": ["A=1"], **edits}}]}


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        (minimal(), "0.3.0"),
        (minimal(mounts=[{"hostPath": "/a", "containerPath": "/a"}]), "0.3.0"),
        (minimal(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]), "0.4.0"),
        # Hooks (createContainer, args, env) are in every version since 0.3.0.
        (minimal(hooks=[{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                         "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/l"],
                         "env": ["A=1"]}]), "0.3.0"),
        (minimal(deviceNodes=[{"path": "/dev/x", "hostPath": "/r/dev/x"}]), "0.5.0"),
        (minimal(name="0abc-gpu-0"), "0.5.0"),
        ({**minimal(), "annotations": {"a": "b"}}, "0.6.0"),
        ({"kind": "v.com/c", "devices": [{"name": "d", "annotations": {"a": "b"}}]}, "0.6.0"),
        (minimal(kind="k8s.gpu.nvidia.com/claim.v2"), "0.6.0"),
        (minimal(additionalGids=[44]), "0.7.0"),
        (minimal(intelRdt={"closID": "x"}), "0.7.0"),
        ({**minimal(), "containerEdits": {"additionalGids": [44]}}, "0.7.0"),
        (minimal(netDevices=[{"hostInterfaceName": "eth1", "name": "net1"}]), "1.1.0"),
        (minimal(intelRdt={"closID": "x", "schemata": ["L3:0=f"]}), "1.1.0"),
        (minimal(name="9-gpu", mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "b"}],
                 additionalGids=[1]), "0.7.0"),
    ],
)
def test_minimum_version(spec, version):
    assert minimum_version(spec) == version


def test_built_specs_use_the_lowest_version_their_content_allows():
    plain = ContainerEdits(device_nodes=[DeviceNode("/dev/nvidia0", type="c", major=195, minor=0)])
    devices = [CdiDevice("gpu-0", plain)]
    common = ContainerEdits(env=["NVIDIA_VISIBLE_DEVICES=void"])
    at = {uid: build_claim_spec(driver=DRIVER, claim_uid=uid, devices=devices, common=common)
          for uid in (LETTER_UID, UID)}
    assert at[LETTER_UID]["cdiVersion"] == "0.3.0"
    assert at[UID]["cdiVersion"] == "0.5.0"  # device name starts with a digit


# --- names ----------------------------------------------------------------------------


def test_file_and_device_naming(tmp_path):
    assert spec_file_name(DRIVER, UID) == f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert spec_file_name(DRIVER, "a/b") == "k8s.gpu.nvidia.com-claim_a_b.json"
    assert spec_path(tmp_path, DRIVER, UID) == tmp_path / f"k8s.gpu.nvidia.com-claim_{UID}.json"


GPU = ContainerEdits(device_nodes=[DeviceNode("/dev/nvidia0")])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"driver": "gpu.nvidia.com-"}, "CDI vendor 'k8s.gpu.nvidia.com-' must start with a"),
        ({"driver": "gpu/nvidia"}, "CDI class 'nvidia/claim' must start with a letter"),
        ({"devices": [CdiDevice("gpu 0", GPU)]}, f"CDI device name '{UID}-gpu 0' must start"),
        ({"devices": [CdiDevice("gpu-0-", GPU)]}, "must start and end with a letter or digit"),
        ({"claim_uid": "-x"}, "CDI device name '-x-gpu-0'"),
        ({"devices": []}, "needs at least one device"),
        ({"devices": [CdiDevice("gpu-0", GPU)] * 2}, "device names repeat"),
        ({"devices": [CdiDevice("gpu-0")]}, f"CDI device {UID}-gpu-0: no container edits"),
        ({"common": ContainerEdits(env=["NOVALUE"])}, r"containerEdits\.env: 'NOVALUE' is not"),
        ({"common": ContainerEdits(env=["=x"])}, "is not KEY=VALUE"),
        ({"devices": [CdiDevice("g", ContainerEdits(device_nodes=[DeviceNode("dev/x")]))]},
         "path 'dev/x' is not absolute"),
        ({"devices": [CdiDevice("g", ContainerEdits(
            device_nodes=[DeviceNode("/dev/x", permissions="rwx")]))]}, "not a subset of 'rwm'"),
        ({"common": ContainerEdits(hooks=[Hook("prestart", "/bin/hook")])},
         "hookName 'prestart' not in"),
        ({"common": ContainerEdits(hooks=[Hook("createContainer", "hook")])},
         "path 'hook' is not absolute"),
        ({"common": ContainerEdits(mounts=[Mount("", "/x")])}, "needs hostPath and containerPath"),
    ],
)
def test_invalid_specs_are_refused_with_a_clear_message(kwargs, message):
    args = {"driver": DRIVER, "claim_uid": UID, "devices": [CdiDevice("gpu-0", GPU)],
            "common": ContainerEdits(), **kwargs}
    with pytest.raises(CdiError, match=message):
        build_claim_spec(**args)


def test_edits_merge_without_duplicates():
    a = ContainerEdits(env=["A=1"], device_nodes=[DeviceNode("/dev/nvidia0")],
                       mounts=[Mount("/h/x", "/x")])
    b = ContainerEdits(env=("A=1", "B=2"), device_nodes=[DeviceNode("/dev/nvidia0", "/h"),
                                                        DeviceNode("/dev/nvidia1")],
                       mounts=[Mount("/other/x", "/x")], hooks=[Hook("poststop", "/bin/h")])
    merged = a.merge(b)
    assert merged.env == ("A=1", "B=2")
    assert merged.device_nodes == (DeviceNode("/dev/nvidia0"), DeviceNode("/dev/nvidia1"))
    assert merged.mounts == (Mount("/h/x", "/x"),)
    assert merged.hooks == (Hook("poststop", "/bin/h"),)
    assert ContainerEdits(env=["A=1"]) == ContainerEdits(env=("A=1",))


# --- files ----------------------------------------------------------------------------


def spec_for(uid=UID):
    return build_claim_spec(driver=DRIVER, claim_uid=uid, devices=[CdiDevice("gpu-0", GPU)],
                            common=ContainerEdits(env=["NVIDIA_VISIBLE_DEVICES=void"]))


def test_write_spec_is_atomic_and_creates_the_directory(tmp_path):
    cdi_root = tmp_path / "var/run/cdi"
    path = write_spec(cdi_root, spec_for())
    assert path == cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    written = json.loads(path.read_text())
    assert written == spec_for()
    assert minimum_version(written) == written["cdiVersion"]
    assert [p.name for p in cdi_root.iterdir()] == [path.name]  # no temp file left behind
    assert write_spec(cdi_root, spec_for(), claim_uid=UID) == path  # rewrite in place


def test_a_failed_write_keeps_the_previous_spec(tmp_path, monkeypatch):
    path = write_spec(tmp_path, spec_for())
    before = path.read_bytes()
    changed = build_claim_spec(driver=DRIVER, claim_uid=UID,
                               devices=[CdiDevice("gpu-1", GPU)], common=ContainerEdits())

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(CdiError, match=f"cannot write CDI spec {path}: No space left"):
        write_spec(tmp_path, changed)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_an_unsynced_write_creates_the_directory_and_leaves_no_temp_file(tmp_path, monkeypatch):
    # durable=False (a kubelet call's specs, synced once by sync_root) takes its own path
    cdi_root = tmp_path / "var/run/cdi"
    path = write_spec(cdi_root, spec_for(), durable=False)
    assert path == cdi_root / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert json.loads(path.read_text()) == spec_for()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    assert [p.name for p in cdi_root.iterdir()] == [path.name]
    changed = build_claim_spec(driver=DRIVER, claim_uid=UID,
                               devices=[CdiDevice("gpu-1", GPU)], common=ContainerEdits())

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(CdiError, match=f"cannot write CDI spec {path}: No space left"):
        write_spec(cdi_root, changed, durable=False)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == spec_for()
    assert [p.name for p in cdi_root.iterdir()] == [path.name]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(CdiError, match=f"cannot write CDI spec {blocker}/cdi/"):
        write_spec(blocker / "cdi", spec_for(), durable=False)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_write_spec_refuses_a_version_below_its_content(tmp_path):
    spec = {**spec_for(), "cdiVersion": "0.3.0"}
    with pytest.raises(CdiError, match=r"cdiVersion '0\.3\.0' but its content needs 0\.5\.0"):
        write_spec(tmp_path, spec)
    with pytest.raises(CdiError, match="not a claim spec"):
        write_spec(tmp_path, {**spec_for(), "kind": "nvidia.com/gpu"})


def test_claim_uid_comes_from_device_names_or_must_be_given(tmp_path):
    spec = build_claim_spec(driver=DRIVER, claim_uid="claim-1", devices=[CdiDevice("gpu-0", GPU)],
                            common=ContainerEdits())
    with pytest.raises(CdiError, match="pass claim_uid"):
        write_spec(tmp_path, spec)
    assert write_spec(tmp_path, spec, claim_uid="claim-1").name == (
        "k8s.gpu.nvidia.com-claim_claim-1.json")


def test_unwritable_cdi_root_names_the_path(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(CdiError, match=f"cannot write CDI spec {blocker}/cdi/"):
        write_spec(blocker / "cdi", spec_for())


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cdi_root_names_the_path(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(CdiError, match=f"cannot write CDI spec {tmp_path}/.*Permission denied"):
            write_spec(tmp_path, spec_for())
    finally:
        tmp_path.chmod(0o755)


def test_remove_is_idempotent_and_list_finds_strays(tmp_path):
    write_spec(tmp_path, spec_for(UID))
    write_spec(tmp_path, spec_for(LETTER_UID))
    (tmp_path / "k8s.gpu.nvidia.com-claim_legacy-uid.yaml").write_text("{}")  # NVIDIA's driver
    (tmp_path / "k8s.other.example.com-claim_x.json").write_text("{}")
    (tmp_path / f".k8s.gpu.nvidia.com-claim_{UID}.json.tmp-1").write_text("")
    assert list_claim_specs(tmp_path, DRIVER) == {
        UID: tmp_path / f"k8s.gpu.nvidia.com-claim_{UID}.json",
        LETTER_UID: tmp_path / f"k8s.gpu.nvidia.com-claim_{LETTER_UID}.json",
        "legacy-uid": tmp_path / "k8s.gpu.nvidia.com-claim_legacy-uid.yaml",
    }
    assert remove_spec(tmp_path, DRIVER, UID) is True
    assert remove_spec(tmp_path, DRIVER, UID) is False
    assert UID not in list_claim_specs(tmp_path, DRIVER)
    assert list_claim_specs(tmp_path / "missing", DRIVER) == {}
