"""A real etcd and kube-apiserver for a test (lab.kube.local): HTTPS on a loopback address of the
tests' range (127.0.22.0/24 unless GPUREADY_TEST_NET says otherwise), its own certificates,
admin kubeconfig and token, and an audit log of every write to a Node.

The gate's and drift's unit tests and bench/gate.py use it; it needs the built binaries
(`make setup`), no root and no lab.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.kube.local import API_PORT, LocalApiServer, running

# The tests' share of loopback (never the labs' /24s); each module takes its own address.
TEST_NET = os.environ.get("GPUREADY_TEST_NET", "127.0.22")
PORT = API_PORT

__all__ = ["PORT", "LocalApiServer", "core_api", "loopback_address", "running_apiserver"]


def loopback_address(host: int) -> str:
    return f"{TEST_NET}.{host}"


@contextlib.contextmanager
def running_apiserver(tmp: Path, host: int,
                      controllers: tuple[str, ...] = ()) -> Iterator[LocalApiServer]:
    """A new cluster on 127.0.22.<host>, stopped when the ``with`` ends, however it ends;
    ``controllers``: kube-controller-manager's, when the test needs them (lab.kube.local)."""
    with running(tmp / "apiserver", loopback_address(host), controllers) as server:
        yield server


def core_api(server: LocalApiServer) -> Any:
    """The official client's CoreV1Api, configured from the server's admin kubeconfig."""
    from kubernetes import client, config  # noqa: PLC0415

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig),
                            client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))
