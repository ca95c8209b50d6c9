"""Lab hosts of more than one OS (issue 14): `os:` per pool or host in fleet files, one cached
rootfs per OS, OS groups and the lab key's fingerprint in the generated inventory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lab import fleet, inventory, rootfs
from lab.errors import LabError
from lab.paths import LabPaths


def _fleet(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yml"
    path.write_text(body)
    return path


def test_os_per_pool_and_per_host(tmp_path: Path) -> None:
    path = _fleet(tmp_path, """
pools:
  pool_a: {hw_profile: h100-sxm5-8x}
  pool_b: {hw_profile: l40s-pcie-4x, os: debian-13}
hosts:
  - {name: n1, pool: pool_a}
  - {name: n2, pool: pool_b}
  - {name: n3, pool: pool_a, os: debian-13}
  - {name: n4, pool: pool_b, os: debian-12}
""")
    hosts = fleet.load_fleet(str(path))
    assert [(h.name, h.os) for h in hosts] == [
        ("n1", "debian-12"), ("n2", "debian-13"), ("n3", "debian-13"), ("n4", "debian-12")]
    # --nodes spreads hosts over the pools with the pools' OS.
    spread = fleet.load_fleet(str(path), nodes=4)
    assert [h.os for h in spread] == ["debian-12", "debian-13", "debian-12", "debian-13"]


@pytest.mark.parametrize(("where", "body"), [
    ("pool 'pool_a'", "pools:\n  pool_a: {hw_profile: h100-sxm5-8x, os: ubuntu-24.04}\n"
                      "hosts:\n  - {name: n1, pool: pool_a}\n"),
    ("host 'n1'", "pools:\n  pool_a: {hw_profile: h100-sxm5-8x}\n"
                  "hosts:\n  - {name: n1, pool: pool_a, os: debian-11}\n"),
])
def test_unknown_os_is_refused_naming_the_entry(tmp_path: Path, where: str, body: str) -> None:
    path = _fleet(tmp_path, body)
    with pytest.raises(LabError) as err:
        fleet.load_fleet(str(path))
    message = str(err.value)
    assert str(path) in message and where in message and "debian-12, debian-13" in message


def test_the_mixed_fleet_has_a_debian_13_host() -> None:
    hosts = fleet.load_fleet("mixed")
    assert {h.os for h in hosts} == {"debian-12", "debian-13"}
    assert [h.name for h in hosts if h.os == "debian-13"] == ["node3"]


def test_each_os_has_its_own_cached_rootfs() -> None:
    cache = Path("/nonexistent-cache")
    paths = {key: rootfs.rootfs_path(cache, key) for key in rootfs.OSES}
    assert paths["debian-12"].name.startswith("rootfs-bookworm-")
    assert paths["debian-13"].name.startswith("rootfs-trixie-")
    assert rootfs.recipe("debian-12")["suite"] == "bookworm"
    assert rootfs.recipe("debian-13")["suite"] == "trixie"
    # Changing one OS's recipe never invalidates the other's cache.
    assert rootfs.recipe_hash("debian-12") != rootfs.recipe_hash("debian-13")
    with pytest.raises(LabError, match="unknown os 'debian-11'"):
        rootfs.rootfs_path(cache, "debian-11")


def test_inventory_groups_hosts_by_os_and_pins_the_lab_key(tmp_path: Path) -> None:
    hosts = fleet.load_fleet("mixed")
    paths = LabPaths(tmp_path)
    data = inventory.render(paths, hosts, 18084, repo_key_fingerprint="AB" * 20)
    children = data["all"]["children"]
    assert set(children["os_debian_12"]["hosts"]) == {"node1", "node2", "node4"}
    assert set(children["os_debian_13"]["hosts"]) == {"node3"}
    assert data["all"]["vars"]["gpuready_lab_repo_key_fingerprint"] == "AB" * 20
    # Pools stay the gpu_nodes children the roles and validators read.
    assert set(children["gpu_nodes"]["children"]) == {
        "pool_h100_sxm", "pool_l40s_pcie", "pool_a100_sxm"}
    yaml.safe_dump(data)  # writable as the hosts.yml Ansible reads


def test_lab_inventory_pins_debian_13_apart() -> None:
    group_vars = Path(__file__).resolve().parents[3] / "inventory" / "lab" / "group_vars"
    debian13 = yaml.safe_load((group_vars / "os_debian_13" / "bootstrap.yml").read_text())
    everyone = yaml.safe_load((group_vars / "all" / "bootstrap.yml").read_text())
    assert debian13["nvidia_driver_branch"] != everyone["nvidia_driver_branch"]
    assert debian13["nvidia_driver_version"].startswith(debian13["nvidia_driver_branch"] + ".")
    # Every repository in the lab is trusted through the key the lab made, never a vendor's.
    pinned = [k for k in everyone if k.endswith("_repo_key_fingerprint")]
    # The driver, containerd (Docker's containerd.io), the toolkit, the kubelet, the tools.
    assert len(pinned) == 5
    assert {everyone[k] for k in pinned} == {"{{ gpuready_lab_repo_key_fingerprint }}"}


def test_real_kubernetes_fleets_get_the_lab_join_settings_from_the_lab_not_the_roles(
        tmp_path: Path) -> None:
    """What a real kubeadm join needs of this machine (a shared network namespace, its kernel)
    is the generated inventory's, for fleets with `kubernetes: real` only; the role's defaults
    keep every preflight check and the kubelet's own settings."""
    paths = LabPaths(tmp_path)
    real = inventory.render(paths, fleet.load_fleet("cluster"), 18084)
    node1 = real["all"]["children"]["gpu_nodes"]["children"]["pool_h100_sxm"]["hosts"]["node1"]
    assert node1["node_join_kubelet_configuration"] == {
        "address": node1["ansible_host"], "healthzBindAddress": node1["ansible_host"]}
    assert "Port-10250" in real["all"]["vars"]["node_join_ignore_preflight_errors"]
    cp1 = real["all"]["children"]["kube_control_plane"]["hosts"]["cp1"]
    assert "node_join_kubelet_configuration" not in cp1
    plain = inventory.render(paths, fleet.load_fleet("mixed"), 18084)
    assert "node_join_ignore_preflight_errors" not in plain["all"]["vars"]
    defaults = yaml.safe_load((Path(__file__).resolve().parents[3] / "roles" / "node_join"
                               / "defaults" / "main.yml").read_text())
    assert defaults["node_join_ignore_preflight_errors"] == []
    assert defaults["node_join_kubelet_configuration"] == {}


def test_a_control_plane_is_always_real_kubernetes(tmp_path: Path) -> None:
    """Every fleet with a control plane runs the built Kubernetes; the stand-in is gone, and a
    fleet that still asks for it is told so, naming the file."""
    hosts = fleet.load_fleet("cluster")
    assert {h.kubernetes for h in hosts} == {fleet.REAL}
    assert {h.kubernetes for h in fleet.load_fleet("mixed")} == {""}  # no control plane
    path = tmp_path / "old.yml"
    path.write_text("kubernetes: stand-in\npools:\n  p: {hw_profile: h100-sxm5-8x}\n"
                    "hosts:\n  - {name: n1, pool: p}\ncontrol_plane:\n  - {name: cp1}\n")
    with pytest.raises(LabError) as err:
        fleet.load_fleet(str(path))
    assert str(err.value).startswith(f"{path}: kubernetes: 'stand-in': ")
    assert "stand-in is gone" in str(err.value)
    path.write_text(path.read_text().replace("stand-in", "real"))  # still accepted
    assert {h.kubernetes for h in fleet.load_fleet(str(path))} == {fleet.REAL}
