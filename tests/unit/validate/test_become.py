"""Log in as a user, run as root where needed (issue 9): ansible_become read as Ansible reads it,
commands that need root run through ``sudo -n``, a refusal is a row naming the command.

The refusal here is scripted (a transport that answers with sudo's message); the lab module
tests/lab/test_bastion.py gets the real one from a host whose user has no sudo right."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.validate.test_checks_runner import Answer, ScriptedTransport, _node
from validate import runner
from validate.checks import select
from validate.inventory import InventoryError, load
from validate.model import CODE_SUDO_DENIED, Status
from validate.transport import CommandResult

HOSTS = ("all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
         "          hosts:\n            n1: {}\n")


def _inventory(tmp_path: Path, host_vars: str) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text(HOSTS)
    (inv / "group_vars" / "pool_h100_sxm.yml").write_text("gpu_profile: h100-sxm5-80gb-8x\n")
    (inv / "host_vars" / "n1.yml").write_text(host_vars + "\n")
    return inv


@pytest.mark.parametrize(("host_vars", "become_user"), [
    ("ansible_user: ops", None),
    ("ansible_user: ops\nansible_become: true", "root"),
    ("ansible_become: \"yes\"\nansible_become_user: gpu-admin", "gpu-admin"),
    ("ansible_become: \"false\"\nansible_become_method: su", None),
])
def test_become_is_read_as_ansible_reads_it(tmp_path: Path, host_vars: str,
                                            become_user: str | None) -> None:
    (node,) = load(_inventory(tmp_path, host_vars))
    assert node.become_user == become_user


@pytest.mark.parametrize(("host_vars", "message"), [
    ("ansible_become: true\nansible_become_method: su",
     r"host n1: ansible_become_method is 'su'; the validators become root only with sudo"),
    ("ansible_become: maybe", r"host n1: ansible_become is 'maybe', not a boolean"),
])
def test_unsupported_become_is_an_inventory_error(tmp_path: Path, host_vars: str,
                                                  message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        load(_inventory(tmp_path, host_vars))


def _journal(text: str, rc: int = 0, err: str = "") -> Answer:
    return lambda argv: CommandResult(argv, rc, text, err, 0.05)


def test_the_kernel_log_is_read_through_sudo_when_the_inventory_becomes() -> None:
    node = replace(_node(), user="ops", become_user="root")
    t = ScriptedTransport("n1", {("sudo", "-n", "-u", "root", "--", "journalctl"):
                                 _journal("-- No entries --\n")})
    rows = runner.run_node(node, select("gpu.xid"), "r1", t)
    assert t.calls[0][:6] == ("sudo", "-n", "-u", "root", "--", "journalctl")
    assert {r.status for r in rows} == {Status.PASS}


def test_without_become_the_login_user_reads_it() -> None:
    t = ScriptedTransport("n1", {("journalctl",): _journal("-- No entries --\n")})
    rows = runner.run_node(_node(), select("gpu.xid"), "r1", t)
    assert t.calls[0][0] == "journalctl"
    assert {r.status for r in rows} == {Status.PASS}


def test_a_sudo_refusal_is_an_error_row_naming_the_command() -> None:
    node = replace(_node(), user="ops", become_user="root")
    # SIMULATED: sudo 1.9's message for a user without a passwordless right.
    refused = _journal("", 1, "sudo: a password is required\n")
    t = ScriptedTransport("n1", {("sudo",): refused})
    (row,) = runner.run_node(node, select("gpu.xid"), "r1", t)
    assert (row.status, row.code) == (Status.ERROR, CODE_SUDO_DENIED)
    assert row.detail.startswith("sudo -n refused journalctl --no-pager -o short-iso")
    assert "for ops: sudo: a password is required" in row.detail


def test_a_login_as_the_become_user_runs_without_sudo() -> None:
    # ansible_user: root with ansible_become: true (common in real inventories) needs no sudo,
    # and the node may not have it installed.
    node = replace(_node(), user="root", become_user="root")
    t = ScriptedTransport("n1", {("journalctl",): _journal("-- No entries --\n")})
    rows = runner.run_node(node, select("gpu.xid"), "r1", t)
    assert t.calls[0][0] == "journalctl"
    assert {r.status for r in rows} == {Status.PASS}
