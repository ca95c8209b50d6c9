"""Inventory reading through Ansible's API: merge order, pools, limits, connection settings."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from validate import cli
from validate.desired import Pins
from validate.inventory import InventoryError, load, profile_for
from validate.model import ExitCode


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



def test_each_node_carries_its_resolved_profile(inv: Path, tmp_path: Path) -> None:
    """load() resolves each distinct (profile, overrides) once and hands it to its nodes;
    the overrides of each node are applied to its own profile only."""
    nodes = {n.name: n for n in load(inv)}
    h1, h2, l1 = nodes["gpu-h100-01"], nodes["gpu-h100-02"], nodes["gpu-l40s-01"]
    assert h1.loaded_profile is not None and l1.loaded_profile is not None
    assert (h1.loaded_profile.name, l1.loaded_profile.name) == (
        "h100-sxm5-80gb-8x", "l40s-pcie-48gb-4x")
    busbw = "allreduce_busbw_gbps"
    assert h1.loaded_profile.thresholds["nccl"][busbw]["warn"] == 470
    assert h2.loaded_profile is not None
    assert h2.loaded_profile.thresholds["nccl"][busbw]["fail"] == 100
    assert h1.loaded_profile.thresholds["nccl"][busbw]["fail"] != 100
    # Two nodes with the same profile and overrides share one loaded profile.
    twins = load(_write(tmp_path / "twins", {
        "hosts.yml": "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_l:\n"
                     "          hosts:\n            a: {}\n            b: {}\n",
        "group_vars/pool_l.yml": "gpu_profile: l40s-pcie-48gb-4x\n",
    }))
    assert twins[0].loaded_profile is twins[1].loaded_profile is not None
    # profile_for hands out that object; a load would make a new one.
    assert profile_for(h2) is h2.loaded_profile

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
    ("gpu_pool: [h100]", r"gpu_pool \(set on host n1\) is a list \(\['h100'\]\), not a mapping"),
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


POOLS = """
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            h1: {}
            h2: {}
            h3:
              gpuready_fio_size_mib: lots
        pool_l40s_pcie:
          hosts:
            l1: {}
"""


def test_declared_state_is_read_once_into_typed_records(inv: Path) -> None:
    nodes = {n.name: n for n in load(inv)}
    h100, l40s = nodes["gpu-h100-02"].desired, nodes["gpu-l40s-01"].desired
    assert h100.pins.driver_version == "550.90.07"
    assert l40s.pins.driver_version == "535.161.08"  # templated, as Ansible would
    assert h100.thresholds == {"nccl": {"allreduce_busbw_gbps": {"fail": 100}}}  # host wins
    assert nodes["gpu-h100-01"].desired.thresholds == {
        "nccl": {"allreduce_busbw_gbps": {"warn": 470}}}
    assert h100.services is None and h100.storage.fio_size_mib is None


def test_every_bad_declared_value_is_named_with_where_it_was_set(tmp_path: Path) -> None:
    """Bad values of all hosts are reported together, before anything connects; a bad group
    variable once, with its group and the hosts it reaches."""
    bad = _write(tmp_path / "bad", {
        "hosts.yml": POOLS,
        "group_vars/pool_h100_sxm.yml": (
            "gpu_profile: h100-sxm5-80gb-8x\n"
            "nvidia_driver_version: 550.90\n"  # a YAML float: the pin lost its spelling
            "gpuready_services: nvidia-persistenced\n"),
        "group_vars/pool_l40s_pcie.yml": "gpu_profile: l40s-pcie-48gb-4x\n"
                                         "gpuready_drift_margins: {nccl_busbw_gbps: 5}\n",
    })
    with pytest.raises(InventoryError) as err:
        load(bad)
    text = str(err.value)
    assert "3 bad declared value(s); nothing was connected to" in text
    assert ("nvidia_driver_version (set in group pool_h100_sxm, hosts h1, h2, h3) is the YAML "
            "number 550.9") in text and "quote the version" in text
    assert "gpuready_fio_size_mib (set on host h3) is 'lots', not a positive integer" in text
    assert ("gpuready_drift_margins (set in group pool_l40s_pcie, host l1) nccl_busbw_gbps is "
            "5, not a fraction between 0 and 1") in text
    assert "gpuready_services" not in text  # one unit name is a list of one, as the roles take


@pytest.mark.parametrize(("pool_vars", "expected"), [
    ("gpu_profile: h100-sxm5-80gb-4x\n",
     r"gpu_profile \(set in group pool_h100_sxm, hosts h1, h2\) is not usable: "
     r".*h100-sxm5-80gb-4x"),
    ("gpu_profile: h100-sxm5-80gb-8x\ngpu_thresholds: {nccl: {allreduce_busbw_gbps: {fail: x}}}\n",
     r"gpu_thresholds \(set in group pool_h100_sxm, hosts h1, h2\) is not usable: .*fail"),
])
def test_a_profile_that_cannot_be_used_fails_the_inventory(tmp_path: Path, pool_vars: str,
                                                            expected: str) -> None:
    bad = _write(tmp_path / "bad", {
        "hosts.yml": POOLS.replace("            h3:\n              gpuready_fio_size_mib: lots\n",
                                   ""),
        "group_vars/pool_h100_sxm.yml": pool_vars,
        "group_vars/pool_l40s_pcie.yml": "gpu_profile: l40s-pcie-48gb-4x\n",
    })
    with pytest.raises(InventoryError, match=expected):
        load(bad)
    # The pool that is fine is not the problem: limited to it, the inventory loads.
    assert [n.name for n in load(bad, limit="pool_l40s_pcie")] == ["l1"]


def test_a_shared_template_is_templated_for_each_host(tmp_path: Path) -> None:
    """Values without a template are templated once and shared; one with a template is
    templated per host, with that host's variables (the same text, different answers)."""
    hosts = "\n".join(
        f"            n{i}: {{ansible_host: 127.0.1.{i}, port_base: {2200 + i}, "
        f"driver_branch: '{530 + i}'}}" for i in range(1, 4))
    root = _write(tmp_path / "inv", {
        "hosts.yml": ("all:\n  children:\n    gpu_nodes:\n      children:\n"
                      f"        pool_h100_sxm:\n          hosts:\n{hosts}\n"),
        "group_vars/pool_h100_sxm.yml": (
            "ansible_port: \"{{ port_base }}\"\n"
            "nvidia_driver_version: \"{{ driver_branch }}.161.08\"\n"
            "gpu_profile: h100-sxm5-80gb-8x\n"
            "gpu_pool: {accelerator: h100-80gb, topology: 8gpu-sxm-nvlink, fabric: infiniband,"
            " workload: distributed-training, sharing: full-gpu}\n"),
    })
    nodes = {n.name: n for n in load(root)}
    assert {n: (node.port, node.vars["nvidia_driver_version"]) for n, node in nodes.items()} == {
        "n1": (2201, "531.161.08"), "n2": (2202, "532.161.08"), "n3": (2203, "533.161.08")}
    assert {node.gpu_pool["accelerator"] for node in nodes.values()} == {"h100-80gb"}


GOOD_HOSTS = POOLS.replace("gpuready_fio_size_mib: lots", "gpuready_fio_size_mib: 64")


def _with_h100_vars(root: Path, h100_vars: str, hosts: str = GOOD_HOSTS) -> Path:
    """The two pools of POOLS, with ``h100_vars`` in the H100 pool's group_vars."""
    return _write(root, {
        "hosts.yml": hosts,
        "group_vars/pool_h100_sxm.yml": "gpu_profile: h100-sxm5-80gb-8x\n" + h100_vars,
        "group_vars/pool_l40s_pcie.yml": "gpu_profile: l40s-pcie-48gb-4x\n",
    })


def _refused_as_a_number(root: Path, var: str, number: str) -> None:
    with pytest.raises(InventoryError) as err:
        load(_with_h100_vars(root, f"{var}: {number}\n", hosts=POOLS))
    assert f"{var} (set in group pool_h100_sxm, hosts h1, h2, h3) is the YAML number " \
        f"{number}" in str(err.value)


def test_the_dcgm_pin_reaches_the_checks_and_a_yaml_number_is_refused(tmp_path: Path) -> None:
    """dcgm.diag tells "DCGM is not installed here" (no pin: a skip row) from "dcgmi is missing
    on a node that pins DCGM" (an error) by nvidia_dcgm_version: the loader must hand it to the
    checks, and refuse a pin that YAML turned into a number, as it does the driver's."""
    good = _with_h100_vars(tmp_path / "good", 'nvidia_dcgm_version: "3.3.6"\n')
    nodes = {n.name: n for n in load(good)}
    assert nodes["h1"].vars["nvidia_dcgm_version"] == "3.3.6"
    assert nodes["l1"].vars.get("nvidia_dcgm_version") is None
    _refused_as_a_number(tmp_path / "bad", "nvidia_dcgm_version", "3.3")


def test_the_package_pins_reach_the_desired_state_and_a_yaml_number_is_refused(
        tmp_path: Path) -> None:
    """The upgrade plan compares the roles' package pins with dpkg: the loader hands them over
    as the roles take them (containerd_version "" is the role's "not pinned"; one package name
    is a list of one) and refuses a version YAML turned into a number."""
    good = _with_h100_vars(tmp_path / "good", (
        'containerd_version: ""\n'
        'nvidia_container_toolkit_version: "1.17.3-1"\n'
        'nvidia_container_toolkit_packages: nvidia-container-toolkit\n'
        'kubelet_version: "1.37.2-1.1"\n'
        'kubelet_packages: [kubelet, kubeadm]\n'))
    nodes = {n.name: n for n in load(good)}
    assert nodes["h1"].desired.pins == Pins(
        containerd_version="", toolkit_version="1.17.3-1",
        toolkit_packages=("nvidia-container-toolkit",), kubelet_version="1.37.2-1.1",
        kubelet_packages=("kubelet", "kubeadm"))
    assert nodes["l1"].desired.pins == Pins()
    _refused_as_a_number(tmp_path / "bad", "kubelet_version", "1.37")


@pytest.mark.parametrize("rel, text, line, key", [
    # a host listed twice in one group: Ansible kept the second and warned
    ("hosts.yml", HOSTS.replace("            gpu-l40s-01:\n",
                                "            gpu-l40s-01: {ansible_host: 127.0.1.9}\n"
                                "            gpu-l40s-01:\n"), 19, "gpu-l40s-01"),
    # two teams of one name in a group_vars directory's file
    ("group_vars/all/cluster.yml", "gpuready_cluster_teams:\n  research: {gpus: {a: 1}}\n"
     "  platform: {gpus: {a: 1}}\n  research: {gpus: {a: 2}}\n", 4, "research"),
    # a host_vars file without an extension (Ansible reads it as YAML too)
    ("host_vars/gpu-h100-01", "ansible_user: a\nansible_user: b\n", 2, "ansible_user"),
])
def test_a_duplicate_mapping_key_is_an_error_naming_the_file_and_line(
        inv: Path, rel: str, text: str, line: int, key: str) -> None:
    """ansible.cfg's duplicate_dict_key = error, applied by the loader wherever it runs (not
    only from the checkout, where ansible.cfg is read)."""
    (inv / rel).parent.mkdir(parents=True, exist_ok=True)
    (inv / rel).write_text(text)
    with pytest.raises(InventoryError) as caught:
        load(inv)
    assert str(caught.value) == (f"inventory {inv / rel}:{line}: YAML parsing failed: Found "
                                 f"duplicate mapping key {key!r}.")
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["run", "-i", str(inv), "--out", str(inv.parent / "reports")], out,
                    err) == ExitCode.USAGE_OR_TOOL_ERROR
    assert err.getvalue() == f"error: {caught.value}\n"
    assert not (inv.parent / "reports").exists()


def test_ansible_itself_refuses_a_duplicate_key_with_the_projects_ansible_cfg(
        inv: Path) -> None:
    """ansible-core (2.19) honours duplicate_dict_key: a group_vars file with a duplicate key
    is fatal; a hosts.yml with one is not read at all (Ansible warns that it cannot parse it
    and goes on without its hosts: its unparsed_is_failed setting would also fail every run on
    the implicit localhost, so it is not set; the validators refuse such a file outright)."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from tests.conftest import REPO_ROOT  # noqa: PLC0415

    def listing() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inv), "--list"],
            capture_output=True, text=True, check=False, timeout=120,
            env={**os.environ, "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg")})

    assert listing().returncode == 0
    hosts = (inv / "hosts.yml").read_text()
    (inv / "hosts.yml").write_text(hosts.replace("        mgmt-01: {}\n",
                                                 "        mgmt-01: {}\n        mgmt-01: {}\n"))
    proc = listing()
    assert "Found duplicate mapping key 'mgmt-01'" in proc.stderr
    assert "Unable to parse" in proc.stderr and "gpu-h100-01" not in proc.stdout
    (inv / "hosts.yml").write_text(hosts)
    (inv / "group_vars" / "other.yml").write_text("gpu_profile: a\ngpu_profile: b\n")
    proc = listing()
    assert proc.returncode != 0 and "Found duplicate mapping key 'gpu_profile'" in proc.stderr
