"""Managed files: contents, owners and modes; the runtimes containerd really loads."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from tests.infra.conftest import Desired

RUNTIMES = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes'


def _root_file(host: Any, path: str, mode: int = 0o644) -> Any:
    managed = host.file(path)
    assert managed.is_file, f"{path} missing"
    assert (managed.user, managed.group, managed.mode) == ("root", "root", mode), path
    return managed


def test_nouveau_blacklisted(host: Any) -> None:
    content = _root_file(host, "/etc/modprobe.d/gpuready-blacklist-nouveau.conf").content_string
    assert re.search(r"^blacklist nouveau$", content, re.MULTILINE)
    assert re.search(r"^options nouveau modeset=0$", content, re.MULTILINE)


def test_modules_loaded_at_boot(host: Any, desired: Desired) -> None:
    content = _root_file(host, "/etc/modules-load.d/gpuready.conf").content_string
    lines = {line for line in content.splitlines() if line and not line.startswith("#")}
    assert lines == set(desired["gpu_kernel_prereqs_modules"])


def test_sysctl_file(host: Any, desired: Desired) -> None:
    content = _root_file(host, "/etc/sysctl.d/90-gpuready.conf").content_string
    settings = dict(re.findall(r"^([\w.-]+) = (\S+)$", content, re.MULTILINE))
    wanted = desired["gpu_kernel_prereqs_sysctls"] + desired["gpu_kernel_prereqs_sysctls_extra"]
    assert settings == {item["name"]: str(item["value"]) for item in wanted}
    assert settings["net.ipv4.ip_forward"] == "1"


def test_kernel_state_applied(host: Any, desired: Desired) -> None:
    if desired.in_container:
        pytest.skip("a container shares its host's kernel; the roles manage only the files there")
    wanted = desired["gpu_kernel_prereqs_sysctls"] + desired["gpu_kernel_prereqs_sysctls_extra"]
    for item in wanted:
        assert host.sysctl(item["name"]) == item["value"], item["name"]
    for module in desired["gpu_kernel_prereqs_modules"]:
        assert host.file(f"/sys/module/{module}").is_directory, module
    assert host.run("swapon --show=NAME --noheadings").stdout.strip() == ""


def test_swap_off_at_boot(host: Any) -> None:
    fstab = host.file("/etc/fstab")
    if fstab.exists:
        active = [line for line in fstab.content_string.splitlines()
                  if not line.lstrip().startswith("#") and len(line.split()) > 2
                  and line.split()[2] == "swap"]
        assert active == []
    assert host.file("/etc/systemd/system/swap.target").linked_to == "/dev/null"


def test_peermem_where_fabric_is_rdma(host: Any, desired: Desired) -> None:
    conf = host.file("/etc/modules-load.d/nvidia-peermem.conf")
    if desired["gpu_pool"]["fabric"] in desired["nvidia_driver_peermem_fabrics"]:
        assert "nvidia-peermem" in _root_file(host, conf.path).content_string.splitlines()
    else:
        assert not conf.exists


@pytest.mark.parametrize(("sources", "keyring_var"), [
    ("gpuready-nvidia-cuda.sources", "nvidia_driver_repo_keyring"),
    ("gpuready-nvidia-container-toolkit.sources", "nvidia_container_toolkit_repo_keyring"),
    ("gpuready-kubernetes.sources", "kubelet_repo_keyring"),
])
def test_apt_sources_signed_by_keyring(
        host: Any, desired: Desired, sources: str, keyring_var: str) -> None:
    keyring = desired[keyring_var]
    _root_file(host, keyring)
    content = _root_file(host, f"/etc/apt/sources.list.d/{sources}").content_string
    assert f"Signed-By: {keyring}" in content.splitlines()


@pytest.mark.parametrize(("keyring_var", "fingerprint_var"), [
    ("nvidia_driver_repo_keyring", "nvidia_driver_repo_key_fingerprint"),
    ("nvidia_container_toolkit_repo_keyring", "nvidia_container_toolkit_repo_key_fingerprint"),
    ("kubelet_repo_keyring", "kubelet_repo_key_fingerprint"),
])
def test_keyring_holds_only_the_pinned_key(
        host: Any, desired: Desired, keyring_var: str, fingerprint_var: str) -> None:
    """apt trusts each vendor repository through exactly the key whose fingerprint is pinned."""
    listing = host.check_output(
        "gpg --batch --homedir /var/lib/gpuready/apt-keys/.gnupg --with-colons --show-keys %s",
        desired[keyring_var])
    primaries = re.findall(r"^pub:[^\n]*\nfpr:{9}([0-9A-F]+):", listing, re.MULTILINE)
    # Empty: the role's default, the vendor's real key for this OS (nvidia_driver's per-OS table).
    pinned = desired[fingerprint_var] or desired["_nvidia_driver_repo_key_fingerprint"]
    assert primaries == [str(pinned).replace(" ", "").upper()]


def test_containerd_main_config(host: Any, desired: Desired) -> None:
    content = _root_file(host, "/etc/containerd/config.toml").content_string
    conf_dir = desired["containerd_conf_dir"]
    assert f'imports = ["{conf_dir}/*.toml"]' in content.splitlines()
    assert re.search(r"^\s*SystemdCgroup = true$", content, re.MULTILINE)
    assert not re.search(r"^\s*SystemdCgroup = false$", content, re.MULTILINE)


def _runtimes(config: str) -> str:
    """The CRI runtimes' table prefix for this configuration's version: containerd 1.x's CRI
    plugin (version 2) or containerd 2's runtime plugin (version 3, which its dump quotes with
    single quotes; a drop-in written with double quotes means the same)."""
    if re.search(r"^version = 3$", config, re.MULTILINE):
        quote = "'" if "plugins.'io.containerd.cri.v1.runtime'" in config else '"'
        return f"plugins.{quote}io.containerd.cri.v1.runtime{quote}.containerd.runtimes"
    return RUNTIMES


def test_nvidia_runtime_dropin(host: Any, desired: Desired) -> None:
    path = f"{desired['nvidia_container_toolkit_containerd_conf_dir']}/99-nvidia.toml"
    content = _root_file(host, path).content_string
    name = desired["nvidia_container_toolkit_runtime_name"]
    assert f"[{_runtimes(content)}.{name}.options]" in content
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in content


def test_containerd_config_dump_has_nvidia_runtime(host: Any, desired: Desired) -> None:
    with host.sudo():
        dump = tomllib.loads(host.check_output("containerd config dump"))
    # The CRI runtime plugin of the configuration's version: 1.x's io.containerd.grpc.v1.cri
    # (version 2), 2.x's io.containerd.cri.v1.runtime (version 3).
    plugin = "io.containerd.cri.v1.runtime" if dump["version"] == 3 else "io.containerd.grpc.v1.cri"
    runtimes = dump["plugins"][plugin]["containerd"]["runtimes"]
    name = desired["nvidia_container_toolkit_runtime_name"]
    assert name in runtimes, f"no {name} runtime in `containerd config dump`"
    assert runtimes[name]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # runc must survive the drop-in (containerd 1.x replaces imported plugin sections whole).
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True


def test_cdi_spec(host: Any, desired: Desired) -> None:
    spec = host.file(desired["nvidia_container_toolkit_cdi_spec"])
    if desired["nvidia_container_toolkit_cdi_enabled"]:
        assert spec.is_file
        assert "nvidia.com/gpu" in spec.content_string
    else:
        assert not spec.exists
