"""Inventories for the cluster tests: copies of the shipped ones (inventory/staging.example, and
inventory/lab with the hosts.yml `lab up` would write for a fleet), edited as a site would edit
them: one YAML file changed, the rest as shipped."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from lab import fleet, inventory
from lab.paths import LabPaths

REPO = Path(__file__).resolve().parents[3]
STAGING = REPO / "inventory" / "staging.example"
LAB = REPO / "inventory" / "lab"


def staging_copy(tmp: Path) -> Path:
    target = tmp / "staging"
    shutil.copytree(STAGING, target)
    return target


def lab_copy(tmp: Path, fleet_name: str = "default") -> Path:
    """inventory/lab with the hosts.yml `python -m lab up` writes for ``fleet_name``."""
    target = tmp / f"lab-{fleet_name}"
    shutil.copytree(LAB, target)
    data = inventory.render(LabPaths(tmp / "lab-root"), fleet.load_fleet(fleet_name), 18043)
    (target / "hosts.yml").write_text("---\n" + yaml.safe_dump(data, sort_keys=False))
    return target


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Load one group_vars file, change it, write it back."""
    doc = yaml.safe_load(path.read_text()) or {}
    change(doc)
    path.write_text("---\n" + yaml.safe_dump(doc, sort_keys=False))


def teams_file(inv: Path) -> Path:
    return inv / "group_vars" / "all" / "cluster.yml"
