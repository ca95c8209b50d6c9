"""Through a bastion, as a real GPU network is reached (issue 9).

Two lab hosts: node1 is the bastion, node2 the GPU node behind it. node2 is known only by a
name that the bastion resolves (its /etc/hosts) and this machine does not: all lab hosts share
this machine's loopback network, where every connection, the bastion's forwarded ones too,
comes from 127.0.0.1, so an address rule inside node2 cannot tell the two paths apart; a name
only the bastion resolves can. The direct path fails, and both Ansible (ansible-runner,
``command hostname``) and ``validate run`` reach node2 with
``-F <ssh config> -o ProxyJump=root@<bastion>`` in ``ansible_ssh_common_args``, host keys
checked at both hops against the config's known_hosts file (the bastion under its address, node2
under its name). A wrong key
for the bastion is a ``host.hostkey`` row that names the jump host."""

from __future__ import annotations

import io
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import ansible_runner
import pandas as pd
import pytest
import yaml

from lab import logins
from lab.core import LabState
from lab.paths import REPO_ROOT, LabPaths
from tests.lab.conftest import running_lab, ssh
from validate import cli
from validate.ansible_ssh import runner_settings
from validate.model import CODE_HOSTKEY, CODE_SUDO_DENIED

BEHIND = "gpu-behind-bastion"  # node2's name, resolved only by the bastion

# A run through the bastion ends without a traceback: paramiko's thread for node2's connection
# once raised EOFError when it closed its channel through the bastion's finished connection.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


@pytest.fixture(scope="module")
def fleet() -> Iterator[LabState]:
    with running_lab(nodes=2) as state:
        bastion, target = state.host("node1"), state.host("node2")
        proc = ssh(bastion.address, f"echo '{target.address} {BEHIND}' >> /etc/hosts")
        assert proc.returncode == 0, proc.stderr
        logins.user_login(LabPaths.default(), "node2")
        yield state


def _inventory(tmp: Path, state: LabState, wrong_key: str = "") -> Path:
    """A copy of the lab inventory whose node2 sits behind node1."""
    paths = LabPaths.default()
    bastion, target = state.host("node1"), state.host("node2")
    inv = tmp / "inventory"
    shutil.copytree(REPO_ROOT / "inventory" / "lab" / "group_vars", inv / "group_vars")
    keys = {line.split()[0]: line.split()[1:3]
            for line in paths.known_hosts.read_text().splitlines() if line.strip()}
    # wrong_key: "bastion" or "node" is listed with the other host's key.
    bastion_key = keys[target.address if wrong_key == "bastion" else bastion.address]
    node_key = keys[bastion.address if wrong_key == "node" else target.address]
    known = tmp / "known_hosts"
    known.write_text(f"{bastion.address} {' '.join(bastion_key)}\n"
                     f"{BEHIND} {' '.join(node_key)}\n")
    # OpenSSH hands a ProxyJump's own ssh the -F file but no -o option: the bastion's known_hosts
    # and key come from the ssh config, as a site keeps them.
    config = tmp / "ssh_config"
    config.write_text(f"Host *\n  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n"
                      f"  IdentityFile {paths.ssh_key}\n  BatchMode yes\n")
    common = f"-F {config} -o ProxyJump=root@{bastion.address}"
    hosts = {"all": {"vars": {
        "ansible_user": "root", "ansible_ssh_private_key_file": str(paths.ssh_key),
        "ansible_ssh_common_args": common,
    }, "children": {"gpu_nodes": {"children": {target.pool: {"hosts": {
        "node2": {"ansible_host": BEHIND, "ansible_user": logins.LOGIN_USER,
                  "ansible_become": True}}}}}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def _validate(inv: Path, out: Path) -> pd.DataFrame:
    stdout, stderr = io.StringIO(), io.StringIO()
    cli.main(["run", "-i", str(inv), "--checks", "gpu.xid", "--timeout", "20",
              "--out", str(out)], stdout=stdout, stderr=stderr)
    report = [ln for ln in stdout.getvalue().splitlines() if ln.startswith("report: ")]
    assert report, (stdout.getvalue(), stderr.getvalue())
    return pd.read_csv(Path(report[0].removeprefix("report: ")) / "results.csv")


def test_the_node_is_not_reachable_directly(fleet: LabState, tmp_path: Path) -> None:
    proc = ssh(BEHIND, "true", timeout=30)
    assert proc.returncode != 0
    assert "Could not resolve hostname" in proc.stderr


def test_the_node_refuses_root_logins(fleet: LabState) -> None:
    proc = ssh(fleet.host("node2").address, "true", timeout=30)
    assert proc.returncode != 0
    assert "Permission denied" in proc.stderr


def test_ansible_reaches_the_node_through_the_bastion(fleet: LabState, tmp_path: Path) -> None:
    inv = _inventory(tmp_path, fleet)
    (tmp_path / "runner").mkdir()
    run = ansible_runner.run(private_data_dir=str(tmp_path / "runner"), inventory=str(inv),
                             host_pattern="node2", module="ansible.builtin.command",
                             module_args="id -un", quiet=True,
                             **runner_settings(inv, tmp_path, envvars={
                                 "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
                                 "PATH": f"{Path(sys.executable).parent}:"
                                         f"{os.environ['PATH']}"}))
    assert run.status == "successful", run.stdout.read()[-2000:]
    ok = [e["event_data"]["res"] for e in run.events if e.get("event") == "runner_on_ok"]
    # Logged in as the unprivileged user, become root with sudo (ansible_become).
    assert [r["stdout"] for r in ok] == ["root"]


def test_validate_reaches_the_node_through_the_bastion(fleet: LabState, tmp_path: Path) -> None:
    rows = _validate(_inventory(tmp_path, fleet), tmp_path / "reports")
    assert set(rows["node"]) == {"node2"}
    assert set(rows["status"]) == {"pass"}, rows[["check", "code", "detail"]].to_string()
    assert set(rows["code"]) == {"ok"}


@pytest.mark.parametrize("wrong_key", ["bastion", "node"])
def test_a_wrong_host_key_at_either_hop_is_a_clear_error_row(
        fleet: LabState, tmp_path: Path, wrong_key: str) -> None:
    rows = _validate(_inventory(tmp_path, fleet, wrong_key=wrong_key), tmp_path / "reports")
    assert set(rows["status"]) == {"error"}
    assert set(rows["code"]) == {CODE_HOSTKEY}
    bastion = fleet.host("node1").address
    hop = f"jump host root@{bastion}:22: " if wrong_key == "bastion" else ""
    assert rows["detail"].str.contains(f"{hop}host key mismatch").all(), rows["detail"]
    if wrong_key == "node":
        assert not rows["detail"].str.contains("jump host").any()


def test_a_missing_sudo_right_is_an_error_row_naming_the_command(
        fleet: LabState, tmp_path: Path) -> None:
    paths = LabPaths.default()
    logins.user_login(paths, "node2", sudo=False)
    try:
        rows = _validate(_inventory(tmp_path, fleet), tmp_path / "reports")
    finally:
        logins.user_login(paths, "node2")
    assert set(rows["status"]) == {"error"}
    assert set(rows["code"]) == {CODE_SUDO_DENIED}
    detail = rows["detail"].iloc[0]
    assert "sudo -n refused journalctl --no-pager" in detail, detail
    assert f"for {logins.LOGIN_USER}" in detail
