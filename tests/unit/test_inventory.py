"""Inventory reading through Ansible's API: merge order, pools, limits, connection settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.inventory import InventoryError, load


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


HOSTS = """
all:
  vars:
    ansible_user: root
  children:
    gpu_nodes:
      vars:
        ansible_ssh_common_args: "-o UserKnownHostsFile=/tmp/kh-from-args"
      children:
        pool_h100_sxm:
          hosts:
            gpu-h100-01: {ansible_host: 127.0.1.1}
            gpu-h100-02:
              ansible_host: 127.0.1.2
              gpu_thresholds: {nccl: {allreduce_busbw_gbps: {fail: 100}}}
        pool_l40s_pcie:
          hosts:
            gpu-l40s-01:
              ansible_host: 127.0.1.3
              ansible_port: 2222
              gpuready_ssh_known_hosts: /tmp/kh-explicit
    other:
      hosts:
        mgmt-01: {}
"""


@pytest.fixture()
def inv(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "inv",
        {
            "hosts.yml": HOSTS,
            "group_vars/all.yml": 'nvidia_driver_version: "550.90.07"\ngpu_profile: unset\n',
            "group_vars/pool_h100_sxm.yml": (
                "gpu_profile: h100-sxm5-80gb-8x\n"
                "gpu_pool: {accelerator: h100-80gb, topology: 8gpu-sxm-nvlink, fabric: infiniband,"
                " workload: distributed-training, sharing: full-gpu}\n"
                "gpu_thresholds: {nccl: {allreduce_busbw_gbps: {warn: 470}}}\n"
            ),
            "group_vars/pool_l40s_pcie.yml": (
                "gpu_profile: l40s-pcie-48gb-4x\nnvidia_driver_version: \"{{ '535' }}.161.08\"\n"
            ),
            "host_vars/gpu-h100-02.yml": "ansible_user: admin\n",
        },
    )


def test_pools_profiles_and_merge_order(inv: Path) -> None:
    nodes = {n.name: n for n in load(inv)}
    assert sorted(nodes) == ["gpu-h100-01", "gpu-h100-02", "gpu-l40s-01"]  # mgmt-01 excluded
    h1, h2, l1 = nodes["gpu-h100-01"], nodes["gpu-h100-02"], nodes["gpu-l40s-01"]
    assert (h1.pool, h1.profile, l1.pool, l1.profile) == (
        "pool_h100_sxm",
        "h100-sxm5-80gb-8x",
        "pool_l40s_pcie",
        "l40s-pcie-48gb-4x",
    )
    assert h1.gpu_pool["topology"] == "8gpu-sxm-nvlink"
    # group_vars/all < child group vars; templating applied to used vars
    assert h1.vars["nvidia_driver_version"] == "550.90.07"
    assert l1.vars["nvidia_driver_version"] == "535.161.08"
    # host var in inventory beats the group_vars file, host_vars beat group vars
    assert h2.vars["gpu_thresholds"] == {"nccl": {"allreduce_busbw_gbps": {"fail": 100}}}
    assert h1.vars["gpu_thresholds"] == {"nccl": {"allreduce_busbw_gbps": {"warn": 470}}}
    assert (h1.user, h2.user) == ("root", "admin")


def test_connection_settings(inv: Path) -> None:
    nodes = {n.name: n for n in load(inv)}
    h1, l1 = nodes["gpu-h100-01"], nodes["gpu-l40s-01"]
    assert (h1.address, h1.port, l1.port) == ("127.0.1.1", 22, 2222)
    assert str(h1.known_hosts) == "/tmp/kh-from-args"
    assert str(l1.known_hosts) == "/tmp/kh-explicit"
    assert h1.accept_unknown_host_keys is False


def test_limit_uses_ansible_patterns(inv: Path) -> None:
    assert [n.name for n in load(inv, limit="pool_h100_sxm:!gpu-h100-02")] == ["gpu-h100-01"]
    assert [n.name for n in load(inv, limit="gpu-*-01")] == ["gpu-h100-01", "gpu-l40s-01"]
    # a term that matches no host is a usage error, also next to terms that do match
    for limit in ("nothing-matches", "gpu-h100-01,gpu-h100-O2", "pool_h100_sxm:!gpu-h100-99"):
        with pytest.raises(InventoryError, match="matches no host"):
            load(inv, limit=limit)
    # a real host outside gpu_nodes matches a term, and leaves no GPU node to validate
    assert load(inv, limit="mgmt-01") == ()


def test_host_without_pool_or_profile_is_an_error(tmp_path: Path) -> None:
    bad = _write(
        tmp_path / "bad",
        {
            "hosts.yml": (
                "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_x:\n"
                "          hosts:\n            n1: {}\n"
            )
        },
    )
    with pytest.raises(InventoryError, match="gpu_profile"):
        load(bad)
    with pytest.raises(InventoryError, match="does not exist"):
        load(tmp_path / "missing")


INI = """
[gpu_nodes:children]
pool_h100_sxm

[pool_h100_sxm]
gpu-h100-01 ansible_host=127.0.1.1 gpuready_ssh_accept_unknown_host_keys=false
gpu-h100-02 ansible_host=127.0.1.2 gpuready_ssh_accept_unknown_host_keys=yes
gpu-h100-03 ansible_host=127.0.1.3 gpuready_ssh_accept_unknown_host_keys=maybe

[pool_h100_sxm:vars]
gpu_profile=h100-sxm5-80gb-8x
"""


def test_booleans_follow_ansible_rules_in_ini_and_quoted_yaml(tmp_path: Path) -> None:
    """INI values and quoted YAML are strings: "false" must read as false (bool("false") is
    true, which once turned host key checking off), and a non-boolean is an error."""
    ini = _write(tmp_path / "ini", {"hosts.ini": INI})
    nodes = {n.name: n for n in load(ini / "hosts.ini", limit="gpu-h100-01,gpu-h100-02")}
    assert nodes["gpu-h100-01"].accept_unknown_host_keys is False
    assert nodes["gpu-h100-02"].accept_unknown_host_keys is True
    with pytest.raises(InventoryError, match=r"host gpu-h100-03: "
                                             r"gpuready_ssh_accept_unknown_host_keys is 'maybe'"):
        load(ini / "hosts.ini")
    yml = _write(tmp_path / "yml", {"hosts.yml": (
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
        "          vars: {gpu_profile: h100-sxm5-80gb-8x}\n          hosts:\n"
        "            a: {gpuready_ssh_accept_unknown_host_keys: \"false\"}\n"
        "            b: {gpuready_ssh_accept_unknown_host_keys: \"off\"}\n"
        "            c: {gpuready_ssh_accept_unknown_host_keys: 0}\n")})
    assert {n.accept_unknown_host_keys for n in load(yml)} == {False}


@pytest.mark.parametrize(("host_vars", "message"), [
    ("ansible_port: \"{{ no_such_variable }}\"", r"host n1: variable ansible_port cannot be "
                                                  r"templated: .*no_such_variable"),
    ("ansible_port: twenty-two", r"host n1: ansible_port is 'twenty-two', not a TCP port"),
    ("ansible_port: 70000", r"host n1: ansible_port is 70000, not a TCP port"),
    ("gpu_pool: [h100]", r"host n1: gpu_pool must be a mapping, got \['h100'\]"),
    ("gpu_profile: \"{{ 1 / 0 }}\"", r"host n1: variable gpu_profile cannot be templated"),
])
def test_bad_values_name_the_host_and_the_variable(tmp_path: Path, host_vars: str,
                                                   message: str) -> None:
    inv = _write(tmp_path / "inv", {
        "hosts.yml": ("all:\n  children:\n    gpu_nodes:\n      children:\n"
                      "        pool_h100_sxm:\n          hosts:\n            n1: {}\n"),
        "group_vars/pool_h100_sxm.yml": "gpu_profile: h100-sxm5-80gb-8x\n",
        "host_vars/n1.yml": host_vars + "\n",
    })
    with pytest.raises(InventoryError, match=message):
        load(inv)
