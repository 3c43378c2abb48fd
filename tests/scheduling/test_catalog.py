"""The catalog ``validate`` checks claims against is exactly what the device model publishes.

Devices are built from every simulated node profile, with and without dynamic MIG (so full
GPUs, dynamic and static MIG devices all appear): each attribute and capacity they carry
must be in the catalog with the right type, and each catalog entry must be carried by some
device of that type.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.controller.slices import encode_attribute
from gpudra.driver import sim
from gpudra.driver.device_model import (
    MEMORY_SLICE_CAPACITY,
    PUBLISHED_ATTRIBUTES,
    PUBLISHED_CAPACITIES,
    ModelOptions,
    build_devices,
)
from gpudra.driver.devices import Device
from gpudra.driver.gpu_shares import ALL
from gpudra.driver.inventory import read_inventory, simulated_pcie_root
from gpudra.driver.nvml import open_nvml
from gpudra.driver.vfio_model import VfioOffer
from gpudra.driver.vfio_sysfs import sysfs_bus_id
from gpudra.scheduling.catalog import (
    ATTRIBUTES,
    CAPACITIES,
    STANDARD_ATTRIBUTES,
    STANDARD_DOMAIN,
    is_known_capacity,
    known_attributes,
)
from gpudra.scheduling.validate import validate_object

DRIVER = "gpu.nvidia.com"
_MEMORY_SLICE = re.compile(rf"^{MEMORY_SLICE_CAPACITY}\d+$")


@pytest.fixture(scope="module")
def devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Device]]:
    """Every device of every simulated profile, with and without dynamic MIG, every GPU
    shareable (so shared devices appear too)."""
    built: list[Device] = []
    for profile in sim.node_profiles():
        for dynamic_mig in (True, False):
            state: Path = tmp_path_factory.mktemp(f"{profile}-{dynamic_mig}")
            nvml = open_nvml(simulate=profile, sim_state=state)
            try:
                inventory = read_inventory(nvml, pcie_root=simulated_pcie_root)
            finally:
                nvml.shutdown()
            buses = [sysfs_bus_id(g.probe.pci_bus_id) for g in inventory.gpus]
            vfio = VfioOffer({b: i for i, b in enumerate(buses)},  # passthrough too
                             {b: ("0x10de", "0x2330") for b in buses})
            built += build_devices(inventory, ModelOptions(dynamic_mig=dynamic_mig,
                                                           shareable=ALL, vfio=vfio)).devices
    yield built
    sim.uninstall()


def dra_type(value: object) -> str:
    """The ``DeviceAttribute`` field a value is sent in: string, int, bool or version."""
    return next(iter(encode_attribute(value)))  # type: ignore[arg-type]


def split(qualified: str) -> tuple[str, str]:
    domain, _, name = qualified.rpartition("/")
    return domain or DRIVER, name


def test_the_profiles_cover_every_device_kind(devices):
    kinds = {d.type for d in devices}
    assert kinds == set(PUBLISHED_ATTRIBUTES) == {"gpu", "mig", "gpu-share", "vfio"}
    assert any(_MEMORY_SLICE.match(c) for d in devices for c in d.capacity), "no static MIG"


def test_every_published_attribute_is_in_the_catalog_with_its_type(devices):
    for device in devices:
        for qualified, value in device.attributes.items():
            domain, name = split(qualified)
            known = known_attributes(domain, DRIVER)
            assert known is not None, (device.name, qualified)
            assert known.get(name) == dra_type(value), (device.name, qualified, value)
            assert type(value) is PUBLISHED_ATTRIBUTES[device.type][qualified]


def test_every_published_capacity_is_in_the_catalog(devices):
    for device in devices:
        for name in device.capacity:
            assert is_known_capacity(name), (device.name, name)
            assert name in PUBLISHED_CAPACITIES[device.type] or _MEMORY_SLICE.match(name)


def test_the_catalog_has_nothing_that_is_never_published(devices):
    published = {(d.type, a) for d in devices for a in d.attributes}
    declared = {(kind, a) for kind, names in PUBLISHED_ATTRIBUTES.items() for a in names}
    assert declared == published
    capacities = {(d.type, c) for d in devices for c in d.capacity if not _MEMORY_SLICE.match(c)}
    declared_capacities = {(kind, c) for kind, names in PUBLISHED_CAPACITIES.items()
                           for c in names}
    assert declared_capacities == capacities
    own = {split(a)[1] for d in devices for a in d.attributes if split(a)[0] == DRIVER}
    standard = {split(a)[1] for d in devices for a in d.attributes
                if split(a)[0] == STANDARD_DOMAIN}
    assert set(ATTRIBUTES) == own
    assert set(STANDARD_ATTRIBUTES) == standard
    assert set(CAPACITIES) == {c for _, c in capacities}


def test_attributes_no_device_publishes_are_unknown():
    # memoryType was proposed for NVIDIA's driver (GB10) and never published
    assert "memoryType" not in ATTRIBUTES
    assert "addressingMode" in ATTRIBUTES  # NVIDIA publishes it where NVML answers; so do we
    assert known_attributes("example.com", DRIVER) is None


def test_validate_reports_a_selector_on_an_attribute_never_published():
    expression = "device.attributes['gpu.nvidia.com'].memoryType == 'unified'"
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "c", "namespace": "default"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
               "deviceClassName": "gpu.nvidia.com",
               "selectors": [{"cel": {"expression": expression}}]}}]}}}
    messages = [p.message for p in validate_object(obj, driver=DRIVER)]
    assert any("no such attribute: memoryType is not published" in m for m in messages), \
        messages
