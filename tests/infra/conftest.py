"""testinfra checks of converged GPU nodes; they need hosts, so they only run when asked.

Run against any inventory, unchanged (the pins are read from it):
    pytest tests/infra --hosts=ansible://gpu_nodes --ansible-inventory=inventory/staging
Without ``--hosts`` nothing here is collected: testinfra would otherwise test the local machine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO_ROOT / "roles"
PROFILES_DIR = REPO_ROOT / "validate" / "profiles"
_VAR_REF = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "infra: needs converged hosts (pytest --hosts=...)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Only files under this directory reach this conftest's hook.
    if collection_path.suffix == ".py" and not config.getoption("hosts", default=None):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.infra)


def _role_defaults() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for defaults in sorted(ROLES_DIR.glob("*/defaults/main.yml")):
        merged.update(yaml.safe_load(defaults.read_text()) or {})
    return merged


ROLE_DEFAULTS = _role_defaults()


class Desired:
    """What the inventory (else the role defaults) says one host should look like."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.variables: dict[str, Any] = host.ansible.get_variables()

    def __getitem__(self, name: str) -> Any:
        if name in self.variables:
            value = self.variables[name]
        elif name in ROLE_DEFAULTS:
            value = ROLE_DEFAULTS[name]
        elif name.startswith("_") and (role := self._role_of(name)):
            value = self.os_table(role).get(name)
            if value is None:
                pytest.fail(f"{name} is not in {role}'s per-OS table for {self.os_id}")
        else:
            pytest.fail(f"{name} is set neither in the inventory nor in a role's defaults")
        # A value that only names another variable ("{{ other }}", as the lab pins its mirror's
        # key and the roles default to their per-OS tables) is read through.
        if isinstance(value, str) and (ref := _VAR_REF.match(value)):
            return self[ref.group(1)]
        if isinstance(value, str) and "{{" in value:
            pytest.fail(f"{name} is a template ({value!r}); these tests need a literal value")
        return value

    @staticmethod
    def _role_of(private_name: str) -> str | None:
        roles = [d.name for d in ROLES_DIR.iterdir() if private_name.startswith(f"_{d.name}_")]
        return max(roles, key=len) if roles else None

    @property
    def profile(self) -> dict[str, Any]:
        name = self["gpu_profile"]
        path = PROFILES_DIR / f"{name}.yml"
        if not path.is_file():
            pytest.fail(f"gpu_profile {name!r}: no profile file {path}")
        profile: dict[str, Any] = yaml.safe_load(path.read_text())
        return profile

    @property
    def os_id(self) -> str:
        """The host's OS as the roles' per-OS tables name it (Debian-13, Ubuntu-24.04)."""
        info = self.host.system_info
        distribution = {"debian": "Debian", "ubuntu": "Ubuntu"}.get(info.distribution,
                                                                     info.distribution)
        release = str(info.release)
        if distribution == "Debian":  # supported per major release, as the roles name it
            release = release.split(".", maxsplit=1)[0]
        return f"{distribution}-{release}"

    def os_table(self, role: str) -> dict[str, Any]:
        """A role's per-OS table (roles/<role>/vars/<OS>.yml) for this host's OS."""
        path = ROLES_DIR / role / "vars" / f"{self.os_id}.yml"
        if not path.is_file():
            pytest.fail(f"{role} has no per-OS table for {self.os_id} ({path})")
        table: dict[str, Any] = yaml.safe_load(path.read_text())
        return table

    @property
    def in_container(self) -> bool:
        # systemd-detect-virt exits 0 in a container, whose kernel state belongs to its host.
        return bool(self.host.run("systemd-detect-virt --container").rc == 0)


@pytest.fixture
def desired(host: Any) -> Desired:
    return Desired(host)


def dpkg_state(host: Any, package: str) -> tuple[str, str]:
    """(dpkg status such as 'hold ok installed', version) of a package; ('', '') if unknown."""
    result = host.run("dpkg-query --show --showformat='${Status}\\t${Version}' %s", package)
    if result.rc != 0:
        return "", ""
    status, _, version = result.stdout.partition("\t")
    return status.strip(), version.strip()
