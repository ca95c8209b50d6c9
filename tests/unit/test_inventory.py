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
    assert load(inv, limit="nothing-matches") == ()


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
