"""Services running and enabled as the inventory and the pool's profile want."""

from __future__ import annotations

from typing import Any

from tests.infra.conftest import Desired


def test_containerd_running_and_enabled(host: Any) -> None:
    service = host.service("containerd")
    assert (service.is_running, service.is_enabled) == (True, True)


def test_persistenced(host: Any, desired: Desired) -> None:
    service = host.service("nvidia-persistenced")
    wanted = bool(desired["nvidia_driver_persistenced_enabled"])
    assert (service.is_running, service.is_enabled) == (wanted, wanted)


def test_fabricmanager_where_profile_has_nvswitch(host: Any, desired: Desired) -> None:
    service = host.service("nvidia-fabricmanager")
    if desired.profile["hardware"]["nvswitch"]:
        assert (service.is_running, service.is_enabled) == (True, True)
    else:
        assert not service.exists


def test_kubelet_enabled(host: Any, desired: Desired) -> None:
    # Not asserted active: kubelet crash-loops until `kubeadm join` gives it a configuration.
    assert host.service("kubelet").is_enabled == bool(desired["kubelet_enabled"])


def test_nvidia_smi_reports_pinned_driver_and_gpu_count(host: Any, desired: Desired) -> None:
    result = host.run("nvidia-smi --query-gpu=driver_version,count --format=csv,noheader")
    assert result.rc == 0, result.stdout + result.stderr
    rows = [line.split(",") for line in result.stdout.splitlines() if line.strip()]
    gpu_count = desired.profile["hardware"]["gpu_count"]
    assert {row[0].strip() for row in rows} == {desired["nvidia_driver_version"]}
    assert {int(row[1]) for row in rows} == {gpu_count}
    assert len(rows) == gpu_count


def test_dcgm_host_engine_running_and_enabled(host: Any, desired: Desired) -> None:
    service = host.service("nvidia-dcgm")
    assert (service.is_running, service.is_enabled) == (True, True)
    version = host.run("dcgmi --version")
    assert version.rc == 0 and str(desired["nvidia_dcgm_version"]) in version.stdout, (
        version.stdout + version.stderr)
