"""Packages at the inventory's pinned versions and held; what the profile excludes is absent."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.conftest import Desired, dpkg_state

HELD = "hold ok installed"


def _driver_table(desired: Desired) -> dict[str, Any]:
    return desired.os_table("nvidia_driver")


def _names(names: list[str], branch: str) -> list[str]:
    return [name.replace("{branch}", branch) for name in names]


def _driver_packages(desired: Desired) -> tuple[list[str], list[str]]:
    """(packages at the pin, the other kernel module flavour) with this OS's package names."""
    table = _driver_table(desired)
    branch = str(desired["nvidia_driver_branch"])
    flavour, other = (("open", "proprietary") if desired["nvidia_driver_open_kernel_modules"]
                      else ("proprietary", "open"))
    kernel = table["_nvidia_driver_kernel_packages"]
    wanted = _names(kernel[flavour] + table["_nvidia_driver_userland_packages"], branch)
    return wanted + desired["nvidia_driver_extra_packages"], _names(kernel[other], branch)


def _driver_package_version(desired: Desired) -> str:
    revision = _driver_table(desired)["_nvidia_driver_package_revision"]
    return f"{desired['nvidia_driver_version']}-{revision}"


def _fabricmanager(desired: Desired) -> tuple[str, str]:
    """(package name, version) of the fabric manager for this OS and driver branch."""
    table = _driver_table(desired)
    branch = str(desired["nvidia_driver_branch"])
    names = table["_nvidia_driver_fabricmanager_names"]
    name = names["from_580"] if int(branch) >= 580 else names["before_580"]
    revision = table["_nvidia_driver_fabricmanager_revision"]
    return name.replace("{branch}", branch), f"{desired['nvidia_driver_version']}-{revision}"


def test_driver_pinned_and_held(host: Any, desired: Desired) -> None:
    wanted, _ = _driver_packages(desired)
    version = _driver_package_version(desired)
    assert {p: dpkg_state(host, p) for p in wanted} == {p: (HELD, version) for p in wanted}


def test_other_kernel_module_flavour_absent(host: Any, desired: Desired) -> None:
    _, unwanted = _driver_packages(desired)
    installed = [p for p in unwanted if dpkg_state(host, p)[0].endswith(" installed")]
    assert installed == []


def test_fabricmanager_as_profile_wants(host: Any, desired: Desired) -> None:
    package, wanted_version = _fabricmanager(desired)
    status, version = dpkg_state(host, package)
    if desired.profile["hardware"]["nvswitch"]:
        assert (status, version) == (HELD, wanted_version)
    else:
        assert not status.endswith(" installed"), f"{package} is {status} {version}"


def test_container_toolkit_pinned_and_held(host: Any, desired: Desired) -> None:
    packages = desired["nvidia_container_toolkit_packages"]
    version = desired["nvidia_container_toolkit_version"]
    assert {p: dpkg_state(host, p) for p in packages} == {p: (HELD, version) for p in packages}


def test_kubernetes_packages_pinned_and_held(host: Any, desired: Desired) -> None:
    packages = desired["kubelet_packages"]
    version = desired["kubelet_version"]
    assert {p: dpkg_state(host, p) for p in packages} == {p: (HELD, version) for p in packages}


def test_containerd_installed(host: Any, desired: Desired) -> None:
    """Docker's containerd.io (vendor, containerd 2: its runc replaces the distribution's), or
    the distribution's containerd, at the pin and held."""
    package = {"vendor": "containerd.io", "distribution": "containerd"}[
        desired["containerd_source"]]
    status, version = dpkg_state(host, package)
    pin = desired["containerd_version"]
    assert status == (HELD if pin else "install ok installed")
    if pin:
        assert version == pin
    if desired["containerd_source"] == "vendor":
        assert dpkg_state(host, "containerd")[0] != "install ok installed"
        assert host.check_output("runc --version").startswith("runc version 1.")


def test_driver_release_pinned_in_apt_preferences(host: Any, desired: Desired) -> None:
    """apt resolves every package of the driver's source release to the pinned version."""
    source = _driver_table(desired)["_nvidia_driver_source_package"].replace(
        "{branch}", str(desired["nvidia_driver_branch"]))
    pref = host.file("/etc/apt/preferences.d/gpuready-nvidia-driver.pref")
    assert pref.is_file
    stanza = (f"Package: src:{source}\nPin: version {_driver_package_version(desired)}\n"
              "Pin-Priority: 1001")
    assert stanza in pref.content_string


@pytest.mark.parametrize("binary", ["nvidia-smi", "nvidia-ctk", "kubelet", "kubeadm", "kubectl"])
def test_tools_on_path(host: Any, binary: str) -> None:
    assert host.exists(binary)


def _validation_tools(desired: Desired) -> dict[str, str]:
    """Package -> pinned version ("" = the distribution's, not held) this host should have."""
    wanted = {"fio": desired["gpu_validation_tools_fio_version"],
              "nccl-tests": desired["gpu_validation_tools_nccl_tests_version"]}
    if desired["gpu_validation_tools_nccl_version"]:
        wanted["libnccl2"] = desired["gpu_validation_tools_nccl_version"]
    if desired["gpu_pool"]["fabric"] in desired["gpu_validation_tools_rdma_fabrics"]:
        wanted["infiniband-diags"] = desired["gpu_validation_tools_infiniband_diags_version"]
        wanted["openmpi-bin"] = desired["gpu_validation_tools_openmpi_version"]
    return wanted


def test_validation_tools_pinned(host: Any, desired: Desired) -> None:
    for package, pin in _validation_tools(desired).items():
        status, version = dpkg_state(host, package)
        assert status == (HELD if pin else "install ok installed"), package
        if pin:
            assert version == pin, package


def test_infiniband_diags_only_on_rdma_pools(host: Any, desired: Desired) -> None:
    status, _ = dpkg_state(host, "infiniband-diags")
    if "infiniband-diags" in _validation_tools(desired):
        assert host.exists("ibstat")
    else:
        assert not status.endswith(" installed")


def test_mpirun_on_rdma_pools(host: Any, desired: Desired) -> None:
    # The multi-node pair check (fabric.nccl_pair) launches all_reduce_perf with it; mpirun
    # starts its daemon on the peer over SSH: orted up to Open MPI 4 (Debian 12), PRRTE's prted
    # from Open MPI 5 on (Debian 13).
    if "openmpi-bin" in _validation_tools(desired):
        assert host.exists("mpirun")
        assert host.exists("orted") or host.exists("prted")


@pytest.mark.parametrize("binary", ["fio", "all_reduce_perf"])
def test_validation_binaries_on_path(host: Any, binary: str) -> None:
    assert host.exists(binary)


def _dcgm_packages(desired: Desired) -> tuple[list[str], str]:
    """(DCGM packages of the pinned series, with DCGM 4's CUDA major, and their version)."""
    pin = str(desired["nvidia_dcgm_version"])
    series = desired.os_table("nvidia_dcgm")["_nvidia_dcgm_series"][pin.partition(".")[0]]
    by_branch = desired.os_table("nvidia_dcgm")["_nvidia_dcgm_cuda_by_driver_branch"]
    cuda = str(desired["nvidia_dcgm_cuda_major"]) or (
        by_branch["from_580"] if int(desired["nvidia_driver_branch"]) >= 580
        else by_branch["before_580"])
    return ([name.replace("{cuda}", cuda) for name in series["packages"]],
            series["package_version"].replace("{upstream}", pin))


def test_dcgm_pinned_and_held(host: Any, desired: Desired) -> None:
    packages, version = _dcgm_packages(desired)
    assert {p: dpkg_state(host, p) for p in packages} == {p: (HELD, version) for p in packages}
