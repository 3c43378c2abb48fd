"""Whoever can connect to the DRA socket can unprepare any claim on the node: ``gpudra node``
started under umask 000 (a careless init system) still makes its sockets 0600 and the
directories it creates for them 0750. The real process, as the kubelet sees it."""

from __future__ import annotations

import os
import stat

from gpudra.kubeletplugin.serving.sockets import dra_socket_path, plugin_data_dir
from tests.integration.daemon import DRIVER, node_daemon


def mode(path: os.PathLike[str]) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_daemon_started_under_umask_000_makes_private_sockets(fake_api) -> None:
    # No kubelet beside it: the registrar dir is the daemon's to create, not the kubelet's.
    with node_daemon(fake_api, kubelet=False) as daemon:
        previous = os.umask(0)  # the daemon inherits it
        try:
            daemon.start(wait=False)
        finally:
            os.umask(previous)
        daemon.wait_registered()
        registration = daemon.registrar / f"{DRIVER}-reg.sock"
        assert mode(dra_socket_path(daemon.plugins, DRIVER)) == 0o600
        assert mode(registration) == 0o600
        for directory in (daemon.registrar, daemon.plugins,
                          plugin_data_dir(daemon.plugins, DRIVER)):
            assert mode(directory) == 0o750, directory
        assert daemon.stop() == 0
