"""Run the lab's API server stand-in for a test: a real HTTPS process on a loopback address of
the tests' range (127.0.22.0/24), with its own state directory, admin kubeconfig and token.

Unit tests, the gate's tests and bench/gate.py use it; it needs no root and no lab.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.apiserver import server
from lab.apiserver.store import read_audit
from lab.controlplane import kubeconfig
from lab.paths import REPO_ROOT

# The tests' share of loopback (never the labs' /24s); each module takes its own address.
TEST_NET = os.environ.get("GPUREADY_TEST_NET", "127.0.22")
PORT = 6443


def standin_address(host: int) -> str:
    return f"{TEST_NET}.{host}"


@dataclass
class StandIn:
    address: str
    state: Path
    token: str
    kubeconfig: Path
    proc: subprocess.Popen[bytes] | None = None
    faults_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"https://{self.address}:{PORT}"

    @property
    def ca_pem(self) -> bytes:
        return (self.state / "pki" / "ca.crt").read_bytes()

    def audit(self) -> list[dict[str, Any]]:
        return read_audit(self.state / "audit.log")

    def start(self, node_grace_s: float = 40.0) -> None:
        argv = [sys.executable, "-m", "lab.apiserver", "serve", "--state", str(self.state),
                "--address", self.address, "--port", str(PORT),
                "--node-grace", str(node_grace_s)]
        if self.faults_dir is not None:
            argv += ["--faults-dir", str(self.faults_dir)]
        log = (self.state / "apiserver.log").open("ab")
        self.proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=log)
        if not server.wait_listening(self.address, PORT, 20):
            self.stop()
            log = (self.state / "apiserver.log").read_text()
            raise RuntimeError(f"stand-in did not start: {log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def running_standin(tmp: Path, host: int, faults_dir: Path | None = None,
                    node_grace_s: float = 40.0,
                    seed_state: Path | None = None) -> Iterator[StandIn]:
    """A stand-in on 127.0.22.<host>: a new cluster, or a copy of ``seed_state`` (made by
    ``server.init_state`` for the same address, objects already stored)."""
    address = standin_address(host)
    state = tmp / "apiserver"
    if seed_state is not None:
        shutil.copytree(seed_state, state)
        token = (state / "tokens.csv").read_text().split(",")[0]
    else:
        state.mkdir(parents=True)
        token = server.init_state(state, address, PORT)
    config = tmp / "admin.conf"
    config.write_text(kubeconfig(f"https://{address}:{PORT}",
                                 (state / "pki" / "ca.crt").read_bytes(), token))
    config.chmod(0o600)
    standin = StandIn(address, state, token, config, faults_dir=faults_dir)
    standin.start(node_grace_s)
    try:
        yield standin
    finally:
        standin.stop()


def core_api(standin: StandIn) -> Any:
    """The official client's CoreV1Api, configured from the stand-in's admin kubeconfig."""
    from kubernetes import client, config  # noqa: PLC0415

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(standin.kubeconfig),
                            client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))
