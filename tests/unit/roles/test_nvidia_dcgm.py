"""The nvidia_dcgm role (issue 31) held to the repository facts and to its argument specs.

The role's per-OS tables (roles/nvidia_dcgm/vars/<OS>.yml) must say what NVIDIA's CUDA repository
of that OS carries (tests/fixtures/vendor-repos/facts.yml, `dcgm`), and the packages the role
computes from the inventories' pins (rendered by Ansible's own templating from vars/main.yml)
must exist there at the pinned version, as the lab serves them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.conftest import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "nvidia_dcgm"
FACTS: dict[str, Any] = yaml.safe_load(
    (REPO_ROOT / "tests" / "fixtures" / "vendor-repos" / "facts.yml").read_text())
CUDA = FACTS["repositories"]["nvidia-cuda"]["os"]
ROLE_OS_FILES = {"debian-12": "Debian-12", "debian-13": "Debian-13",
                 "ubuntu-22.04": "Ubuntu-22.04", "ubuntu-24.04": "Ubuntu-24.04"}
INVENTORIES = ("lab", "staging.example", "production.example")


def _yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return data


def _trusted(value: Any) -> Any:
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def _render(os_key: str, **pins: Any) -> dict[str, Any]:
    """The role's computed package set for an OS and pins, as Ansible templates vars/main.yml."""
    variables: dict[str, Any] = {}
    for part in ("defaults/main.yml", "vars/main.yml", f"vars/{ROLE_OS_FILES[os_key]}.yml"):
        variables.update(_trusted(_yaml(ROLE / part)))
    variables.update(pins)
    templar = Templar(loader=DataLoader(), variables=variables)
    rendered: dict[str, Any] = templar.template(trust_as_template(
        "{{ {'packages': _nvidia_dcgm_packages, 'version': _nvidia_dcgm_package_version,"
        " 'absent': _nvidia_dcgm_absent, 'service': _nvidia_dcgm_service} }}"))
    return rendered


def _pins(inventory: str, os_key: str) -> dict[str, Any]:
    base = REPO_ROOT / "inventory" / inventory / "group_vars"
    pins = _yaml(base / "all" / "bootstrap.yml")
    os_group = base / f"os_{os_key.replace('-', '_').replace('.', '_')}" / "bootstrap.yml"
    if os_group.is_file():
        pins.update(_yaml(os_group))
    return pins


def test_argument_specs_declare_every_default_and_the_required_pins() -> None:
    spec = _yaml(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = _yaml(ROLE / "defaults" / "main.yml")
    assert {name for name, opt in spec.items() if not opt.get("required")} == set(defaults)
    for name, value in defaults.items():
        assert spec[name]["default"] == value, name
    # The pin has no default: the driver branch decides the DCGM a node can run.
    assert {name for name, opt in spec.items() if opt.get("required")} == {
        "nvidia_dcgm_version", "nvidia_driver_branch"}


@pytest.mark.parametrize("os_key", sorted(ROLE_OS_FILES))
def test_role_os_table_is_the_repository_facts(os_key: str) -> None:
    table = _yaml(ROLE / "vars" / f"{ROLE_OS_FILES[os_key]}.yml")
    facts = CUDA[os_key]["dcgm"]
    assert {series: {"packages": s["packages"], "package_version": s["package_version"]}
            for series, s in facts["series"].items()} == table["_nvidia_dcgm_series"]
    cuda = facts["cuda_by_driver_branch"]
    assert table["_nvidia_dcgm_cuda_by_driver_branch"] == {
        "before_580": cuda["before_580"], "from_580": cuda["from_580"]}
    service = _yaml(ROLE / "vars" / "main.yml")["_nvidia_dcgm_service"]
    assert {s["service"]["unit"] for s in facts["series"].values()} == {service}


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("os_key", sorted(ROLE_OS_FILES))
def test_every_package_the_role_installs_exists_in_the_os_facts(inventory: str,
                                                                 os_key: str) -> None:
    pins = _pins(inventory, os_key)
    branch = str(pins["nvidia_driver_branch"])
    series = CUDA[os_key]["dcgm"]["series"]
    version = str(pins["nvidia_dcgm_version"])
    if version.partition(".")[0] not in series:
        # The lab runs no Ubuntu host: its Debian 12 pin (DCGM 3) is not one for Ubuntu.
        assert inventory == "lab" and os_key.startswith("ubuntu"), (inventory, os_key, version)
        pytest.skip(f"the lab pins DCGM {version} and runs no {os_key} host")
    rendered = _render(os_key, nvidia_dcgm_version=version, nvidia_driver_branch=branch)
    facts = series[version.partition(".")[0]]
    release = next((r for r in facts["versions"] if r["upstream"] == version), None)
    assert release is not None, (inventory, os_key, version)
    assert rendered["version"] == facts["package_version"].replace("{upstream}", version)
    universe = {n.replace("{cuda}", c) for n in facts["packages"]
                for c in (release.get("cuda", []) if "{cuda}" in n else [""])}
    assert set(rendered["packages"]) <= universe, (inventory, os_key, rendered)
    assert not set(rendered["absent"]) & set(rendered["packages"])


@pytest.mark.parametrize(("version", "branch", "cuda", "packages", "absent"), [
    ("3.3.6", "550", "", ["datacenter-gpu-manager"],
     ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12",
      "datacenter-gpu-manager-4-cuda13"]),
    ("4.6.0", "550", "", ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
     ["datacenter-gpu-manager", "datacenter-gpu-manager-4-cuda13"]),
    ("4.6.0", "590", "", ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13"],
     ["datacenter-gpu-manager", "datacenter-gpu-manager-4-cuda12"]),
    ("4.6.0", "590", "12", ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12"],
     ["datacenter-gpu-manager", "datacenter-gpu-manager-4-cuda13"]),
])
def test_the_series_and_the_driver_branch_pick_the_packages(
        version: str, branch: str, cuda: str, packages: list[str], absent: list[str]) -> None:
    rendered = _render("debian-12", nvidia_dcgm_version=version, nvidia_driver_branch=branch,
                       nvidia_dcgm_cuda_major=cuda)
    assert rendered["packages"] == packages
    assert sorted(rendered["absent"]) == absent
    assert rendered["version"] == ("1:3.3.6" if version == "3.3.6" else "1:4.6.0-1")
    assert rendered["service"] == "nvidia-dcgm"


def test_bootstrap_runs_the_role_right_after_the_driver() -> None:
    plays = yaml.safe_load((REPO_ROOT / "playbooks" / "bootstrap.yml").read_text())
    roles = [r["role"] for r in plays[1]["roles"]]
    assert roles[roles.index("nvidia_driver") + 1] == "nvidia_dcgm"
    assert {"role": "nvidia_dcgm", "tags": ["nvidia_dcgm"]} in plays[1]["roles"]
