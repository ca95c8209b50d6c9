"""Converged snapshots (lab/snapshot.py, issue 39): the key changes with everything that shapes a
converge and with nothing that does not, and a stale snapshot is never found.

The lab tests boot hosts from real snapshots (tests/lab/conftest.py); these tests hold the key
itself: a role, a play, a simulator, an inventory value, the OS or the pool changed means another
key; a host's own address, or a value only join and the gate read, does not.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from lab import hardware, repo, snapshot
from lab.fleet import CONTROL_PLANE, CONTROL_PLANE_GROUP, REAL, LabHost
from lab.paths import REPO_ROOT, LabPaths

H100 = LabHost(name="node1", pool="pool_h100_sxm", hw_profile="h100-sxm5-8x",
               address="127.0.1.11")
CP = LabHost(name="cp1", pool=CONTROL_PLANE_GROUP, hw_profile="", address="127.0.1.12",
             kind=CONTROL_PLANE, kubernetes=REAL)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the files that shape a converge, and a lab inventory, outside the checkout."""
    root = tmp_path / "repo"
    for rel in snapshot.SHAPING:
        src = REPO_ROOT / rel
        if src.is_dir():
            shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, root / rel)
    shutil.copytree(REPO_ROOT / "inventory" / "lab" / "group_vars",
                    root / "inventory" / "lab" / "group_vars")
    monkeypatch.setattr(snapshot, "REPO_ROOT", root)
    monkeypatch.setenv("GPUREADY_LAB_INVENTORY", str(root / "inventory" / "lab"))
    # The package recipe needs the Kubernetes build; its part of the key is held by the test
    # that changes it below.
    monkeypatch.setattr(repo, "recipe_hash", lambda: "packages-a")
    return root


def _key(host: LabHost, fleet: list[LabHost] | None = None, port: int = 18080,
         fingerprint: str = "F" * 40) -> str:
    paths = LabPaths(Path("/nonexistent/.lab"))
    return snapshot.key(snapshot.host_inputs(paths, host, fleet or [host], port, fingerprint))


def test_the_key_changes_with_what_shapes_a_converge(tree: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    base = _key(H100)
    assert _key(H100) == base  # the same inputs, the same key
    changed: dict[str, str] = {}
    role = tree / "roles" / "containerd" / "defaults" / "main.yml"
    role.write_text(role.read_text() + "\n# a change\n")
    changed["a role's file"] = _key(H100)
    pool = tree / "inventory" / "lab" / "group_vars" / "pool_h100_sxm" / "pool.yml"
    pool.write_text(pool.read_text() + "\nnvidia_driver_version: '550.90.12'\n")
    changed["an inventory value"] = _key(H100)
    sim = tree / "lab" / "sim" / "nvidia_smi.py"
    sim.write_text(sim.read_text() + "\n")
    changed["a simulator"] = _key(H100)
    monkeypatch.setattr(repo, "recipe_hash", lambda: "packages-b")
    changed["the lab's packages"] = _key(H100)
    changed["the repository's signing key"] = _key(H100, fingerprint="E" * 40)
    changed["the repository's port"] = _key(H100, port=18081)
    changed["the OS"] = _key(LabHost(**{**H100.__dict__, "os": "debian-13"}))
    changed["the pool"] = _key(LabHost(**{**H100.__dict__, "pool": "pool_a100_sxm",
                                          "hw_profile": "a100-sxm4-8x"}))
    keys = [base, *changed.values()]
    assert len(set(keys)) == len(keys), changed


def test_the_key_ignores_the_host_s_identity_and_what_bootstrap_does_not_read(
        tree: Path) -> None:
    del tree
    base = _key(H100)
    # Another name and address: a copy of the same converge.
    other = LabHost(**{**H100.__dict__, "name": "node7", "address": "127.0.1.17"})
    assert _key(other) == base
    # The same host in a fleet with a real control plane: the generated inventory adds the
    # kubelet's address, kubeadm's preflight skips and the gate's kubeconfig (join, gate).
    real = LabHost(**{**H100.__dict__, "kubernetes": REAL})
    assert _key(real, [real, CP]) == base


def _bootstrap_roles() -> set[str]:
    """Every role bootstrap.yml runs, directly, by include_role, or from another role."""
    names = {p.name for p in (REPO_ROOT / "roles").iterdir() if p.is_dir()}
    found: set[str] = set()
    texts = [(REPO_ROOT / "playbooks" / "bootstrap.yml").read_text()]
    while texts:
        for word in re.findall(r"[a-z_]+", texts.pop()):
            if word in names and word not in found:
                found.add(word)
                texts += [f.read_text() for f in (REPO_ROOT / "roles" / word).rglob("*")
                          if f.is_file()]
    return found


def test_no_bootstrap_role_reads_the_values_the_key_leaves_out() -> None:
    roles = _bootstrap_roles()
    assert {"nvidia_driver", "containerd", "kubelet", "vendor_apt_repo"} <= roles
    assert "node_join" not in roles  # join's role reads them: the check below can see them
    join = "\n".join(f.read_text() for f in (REPO_ROOT / "roles" / "node_join").rglob("*")
                     if f.is_file())
    assert all(name in join for name in snapshot.NOT_BOOTSTRAP[:2])
    texts = [(REPO_ROOT / "playbooks" / "bootstrap.yml").read_text()]
    texts += [f.read_text() for role in roles
              for f in (REPO_ROOT / "roles" / role).rglob("*") if f.is_file()]
    for name in snapshot.NOT_BOOTSTRAP:
        assert not any(name in text for text in texts), name


def test_a_host_with_an_install_fault_or_no_gpus_never_uses_a_snapshot() -> None:
    assert snapshot.usable(H100)
    assert not snapshot.usable(LabHost(**{**H100.__dict__, "faults": ("driver-install-fail",)}))
    assert snapshot.usable(LabHost(**{**H100.__dict__, "faults": ("ecc-uncorrectable",)}))
    assert not snapshot.usable(CP)
    assert set(hardware.FAULTS) >= hardware.CONVERGE_FAULTS


def test_only_a_complete_snapshot_is_found_and_remove_all_takes_them(tmp_path: Path) -> None:
    paths = LabPaths(tmp_path / ".lab")
    top = snapshot.directory(paths)
    (top / "abc" / "upper").mkdir(parents=True)
    assert snapshot.find(paths, "abc") is None  # a copy that never finished (no snapshot.json)
    (top / "abc" / snapshot.META).write_text(yaml.safe_dump({"key": "abc"}))
    assert snapshot.find(paths, "abc") == top / "abc" / "upper"
    assert snapshot.find(paths, "def") is None
    assert snapshot.remove_all(paths) == 1
    assert not top.exists()
    assert snapshot.remove_all(paths) == 0

