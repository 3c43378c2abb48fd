"""PluginServer lifecycle: sockets appear and disappear, stale files, rolling updates (stop
with grace: test_server_conformance.py)."""

from __future__ import annotations

import asyncio

import pytest

from gpudra.kubeletplugin.serving.server import PluginServer, ServerStartError
from gpudra.testing.kubelet_emulator import KubeletEmulator
from tests.kubeletplugin.conftest import DRIVER, Dirs, TestPreparer, claim

OLD_POD = "11111111-2222-3333-4444-555555555555"
NEW_POD = "66666666-7777-8888-9999-000000000000"


async def test_start_creates_both_sockets_and_stop_removes_them(dirs: Dirs, preparer):
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
    assert not server.serving
    await server.start()
    assert server.serving
    assert server.dra_socket_path.is_socket() and server.registration_socket_path.is_socket()
    assert server.plugin_data_dir == dirs.plugins / DRIVER

    await server.stop(grace=0)
    assert not server.serving
    assert not server.dra_socket_path.exists()
    assert not server.registration_socket_path.exists()
    await server.stop(grace=0)  # idempotent
    await asyncio.gather(server.stop(), server.stop())
    with pytest.raises(RuntimeError, match="twice"):
        await server.start()


async def test_stale_socket_files_are_replaced_at_start(dirs: Dirs, preparer):
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
    for stale in (server.dra_socket_path, server.registration_socket_path):
        stale.parent.mkdir(parents=True)
        stale.write_text("left behind by a crashed daemon")
    async with server, await KubeletEmulator.discover(dirs.registrar) as kubelet:
        assert server.dra_socket_path.is_socket()
        assert (await kubelet.prepare([claim(1)]))["uid-1"]["error"] == ""


async def test_a_failed_start_leaves_no_socket_behind(dirs: Dirs, preparer):
    server = PluginServer(DRIVER, dirs.registrar, dirs.plugins, None, preparer)
    server.registration_socket_path.mkdir(parents=True)
    with pytest.raises(ServerStartError, match="is a directory"):
        await server.start()
    assert not server.dra_socket_path.exists()
    assert not server.serving


async def test_rolling_update_two_instances_side_by_side(dirs: Dirs):
    old_preparer, new_preparer = TestPreparer(), TestPreparer()
    old = PluginServer(DRIVER, dirs.registrar, dirs.plugins, OLD_POD, old_preparer)
    new = PluginServer(DRIVER, dirs.registrar, dirs.plugins, NEW_POD, new_preparer)
    assert old.dra_socket_path.name == f"dra-{OLD_POD}.sock"
    assert old.registration_socket_path.name == f"{DRIVER}-{OLD_POD}-reg.sock"
    assert old.plugin_data_dir == new.plugin_data_dir

    async with old, await KubeletEmulator.discover(dirs.registrar) as kubelet:
        async with new:
            [registered] = await kubelet.rescan()
            assert registered.endpoint == str(new.dra_socket_path)
            await kubelet.prepare([claim(1)])
            assert new_preparer.prepared and not old_preparer.prepared

        # The new pod went away: the kubelet falls back to the old one.
        assert not new.registration_socket_path.exists()
        assert await kubelet.rescan() == []
        await kubelet.unprepare([claim(1)])
        assert old_preparer.unprepared == [[claim(1)]]
        assert old.registration.registered.is_set()


@pytest.mark.parametrize(("dir_bytes", "form"), [
    (26, f"{'a' * 22}.example.org-{NEW_POD}-reg.sock"),
    (51, f"{'a' * 22}.example.org-J47Go2BowJA-reg.sock"),
    (71, "dra-tpK2LHhTFltqfJ1WfHUlUw-reg.sock"),
])
async def test_rolling_update_socket_forms_bind_and_register(dirs: Dirs, dir_bytes, form):
    # A 34-byte driver name, and a registrar dir of the largest size at which each form
    # still fits in 107 bytes: grpc really binds there and the kubelet registers it.
    # Hashes from openssl (see test_sockets.py) for this driver and NEW_POD.
    driver = "a" * 22 + ".example.org"
    root = dirs.registrar.parent
    registrar = root / ("r" * (dir_bytes - len(str(root)) - 1))
    server = PluginServer(driver, registrar, root / "p", NEW_POD, TestPreparer())
    assert server.registration_socket_path.name == form
    assert len(str(server.registration_socket_path).encode()) == 107
    async with server, await KubeletEmulator.discover(registrar) as kubelet:
        assert kubelet.instance().driver == driver
        assert (await kubelet.prepare([claim(1)]))["uid-1"]["error"] == ""
