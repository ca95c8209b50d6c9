"""The vendor repositories as they really are, per OS (issue 16).

Three things are held to the real repositories' facts (tests/fixtures/vendor-repos/facts.yml):

- the facts themselves: every fact names a source; where the source's text is kept in
  excerpts/, the text the fact rests on is really there;
- the lab repository, as `lab up` builds it (real .deb files, dpkg-scanpackages indexes, the
  lab key): a Debian 12 directory serves only what NVIDIA's debian12 repository carries, with its
  revision, source package and the relations that matter; no Ubuntu-shaped name reaches a
  Debian directory; keys sit under the vendors' key file names;
- the roles' per-OS tables and the inventories' pins: every package and version the roles would
  install on an OS exists in that OS's facts, and the keys they pin are the vendors' keys.

The facts file is read here with yaml, never through lab/ (which builds from it): the lab's
output is parsed from the Packages indexes it serves.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.packages import KUBERNETES_MINOR
from tests.conftest import REPO_ROOT

VENDOR = REPO_ROOT / "tests" / "fixtures" / "vendor-repos"
FACTS: dict[str, Any] = yaml.safe_load((VENDOR / "facts.yml").read_text())
REPOS = FACTS["repositories"]
CUDA = REPOS["nvidia-cuda"]["os"]
ROLES = REPO_ROOT / "roles"
STATUSES = {"established", "inferred", "lab-assumed"}
# The OSes lab hosts run (their CUDA directories are served) and the ones only written for.
LAB_OSES = ("debian-12", "debian-13")
ROLE_OS_FILES = {"debian-12": "Debian-12", "debian-13": "Debian-13",
                 "ubuntu-22.04": "Ubuntu-22.04", "ubuntu-24.04": "Ubuntu-24.04"}


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every mapping in the facts, with its dotted path."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def _render(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


# --- the facts ----------------------------------------------------------------------------

def test_every_fact_has_a_status_and_known_sources() -> None:
    sources = FACTS["sources"]
    checked = 0
    for path, node in _walk(REPOS):
        if "status" in node:
            checked += 1
            assert node["status"] in STATUSES, path
            if node["status"] == "inferred":
                assert node.get("reason"), f"{path}: an inferred fact says why"
        for source in node.get("sources", []):
            assert source in sources, f"{path}: unknown source {source!r}"
    assert checked > 60


def test_sources_are_cited_or_copied_with_their_licence() -> None:
    for name, source in FACTS["sources"].items():
        assert source["url"].startswith(("https://", "http://")), name
        assert source.get("license"), name
        if "excerpt" in source:
            assert (VENDOR / source["excerpt"]).is_file(), name
            # Only redistributable text is copied (common rules): Apache-2.0 here.
            assert source["license"].startswith("Apache-2.0"), name
        else:
            assert "not copied" in source["license"], name


def test_quoted_text_is_in_the_excerpts_the_fact_cites() -> None:
    quotes = 0
    for path, node in _walk(REPOS):
        if "quote" not in node:
            continue
        cited = [FACTS["sources"][s] for s in node.get("sources", [])]
        texts = [(VENDOR / s["excerpt"]).read_text() for s in cited if "excerpt" in s]
        # A fact without its own sources quotes its parent's (e.g. a debian package version).
        if not texts:
            parent = path.rsplit(".", 2)[0]
            parent_node = dict(_walk(REPOS))[parent]
            texts = [(VENDOR / FACTS["sources"][s]["excerpt"]).read_text()
                     for s in parent_node.get("sources", [])]
        assert any(node["quote"] in text for text in texts), (path, node["quote"])
        quotes += 1
    assert quotes >= 15


def test_every_excerpt_has_its_sources_row() -> None:
    rows = {line.split("\t")[0] for line in
            (REPO_ROOT / "tests" / "fixtures" / "SOURCES.tsv").read_text().splitlines()[1:]}
    files = sorted(p.relative_to(VENDOR.parent).as_posix() for p in VENDOR.rglob("*")
                   if p.is_file() and p.name != "README.md")
    assert files
    assert [f for f in files if f not in rows] == []


# --- the lab repository, as lab up builds it ----------------------------------------------

def _packages_index(path: Path) -> list[dict[str, str]]:
    stanzas = []
    for block in path.read_text().strip().split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line.startswith(" ") and key:
                fields[key] += "\n" + line
            else:
                key, _, value = line.partition(": ")
                fields[key] = value
        stanzas.append(fields)
    return stanzas


@pytest.fixture(scope="module")
def lab_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The lab repository built by lab.repo into a scratch lab directory; (root, key fpr)."""
    from lab import repo  # noqa: PLC0415  (the lab is imported only to build, not to judge)
    from lab.paths import LabPaths  # noqa: PLC0415

    paths = LabPaths(tmp_path_factory.mktemp("lab"))
    root = repo.ensure_repo(paths)
    yield root, repo.key_fingerprint(paths)


def _served(root: Path, directory: str) -> list[dict[str, str]]:
    return _packages_index(root / directory / "Packages")


def _cuda_universe(os_key: str) -> dict[tuple[str, str], str]:
    """(name, version) -> role ('driver', 'fabricmanager', 'nccl') the facts give for an OS."""
    facts = CUDA[os_key]
    driver, fabric = facts["driver"], facts["fabricmanager"]
    universe = {}
    for release in driver["releases"]:
        upstream = release["upstream"]
        branch = upstream.split(".")[0]
        version = _render(driver["package_version"], upstream=upstream)
        for name in driver["packages"]:
            universe[(_render(name, branch=branch), version)] = "driver"
        fm = (fabric["name_from_580"] if int(branch) >= 580
              else _render(fabric["name_before_580"], branch=branch))
        universe[(fm, _render(fabric["package_version"], upstream=upstream))] = "fabricmanager"
    for nccl in facts["nccl"]["versions"]:
        universe[(facts["nccl"]["name"], nccl["version"])] = "nccl"
    for dcgm in facts.get("dcgm", {}).get("series", {}).values():
        for release in dcgm["versions"]:
            version = _render(dcgm["package_version"], upstream=release["upstream"])
            for name in dcgm["packages"]:
                for cuda in release.get("cuda", []) if "{cuda}" in name else [""]:
                    universe[(_render(name, cuda=cuda), version)] = "dcgm"
    return universe


@pytest.mark.parametrize("os_key", LAB_OSES)
def test_lab_cuda_directory_serves_exactly_the_os_package_set(
        lab_repo: tuple[Path, str], os_key: str) -> None:
    root, _ = lab_repo
    served = _served(root, f"compute/cuda/repos/{CUDA[os_key]['directory']}")
    universe = _cuda_universe(os_key)
    pairs = {(p["Package"], p["Version"]) for p in served}
    assert pairs == set(universe)
    source = CUDA[os_key]["driver"]["source_package"]
    for stanza in served:
        role = universe[(stanza["Package"], stanza["Version"])]
        if role == "driver" and stanza["Package"] != "nvidia-persistenced":
            # What the roles' apt pin on src:<source> matches.
            assert stanza.get("Source") == source, stanza["Package"]
        assert "SIMULATED" in stanza["Description"], stanza["Package"]


@pytest.mark.parametrize("os_key", LAB_OSES)
def test_no_ubuntu_shaped_package_reaches_a_debian_directory(
        lab_repo: tuple[Path, str], os_key: str) -> None:
    root, _ = lab_repo
    served = _served(root, f"compute/cuda/repos/{CUDA[os_key]['directory']}")
    names = {p["Package"] for p in served}
    ubuntu = set()
    for release in CUDA["ubuntu-22.04"]["driver"]["releases"]:
        branch = release["upstream"].split(".")[0]
        ubuntu |= {_render(n, branch=branch) for n in CUDA["ubuntu-22.04"]["driver"]["packages"]}
    assert names & ubuntu == set()
    assert not any("ubuntu" in p["Version"] for p in served)


@pytest.mark.parametrize("os_key", LAB_OSES)
def test_lab_packages_carry_the_relations_that_matter(
        lab_repo: tuple[Path, str], os_key: str) -> None:
    root, _ = lab_repo
    served = _served(root, f"compute/cuda/repos/{CUDA[os_key]['directory']}")
    relations = CUDA[os_key]["driver"]["relations"]
    checked = 0
    for stanza in served:
        branch = stanza["Version"].split(".")[0]
        for relation in relations:
            if _render(relation["package"], branch=branch) != stanza["Package"]:
                continue
            wanted = _render(relation["depends"], version=stanza["Version"], branch=branch)
            assert wanted in [d.strip() for d in stanza.get("Depends", "").split(",")], (
                stanza["Package"], stanza["Version"], wanted)
            checked += 1
    assert checked >= len(CUDA[os_key]["driver"]["releases"])


def test_lab_toolkit_and_kubernetes_repositories_follow_their_facts(
        lab_repo: tuple[Path, str]) -> None:
    root, _ = lab_repo
    toolkit = REPOS["nvidia-container-toolkit"]
    served = _served(root, f"libnvidia-container/{toolkit['directory']}")
    versions = {_render(toolkit["package_version"], upstream=r["upstream"])
                for r in toolkit["releases"]}
    assert {(p["Package"], p["Version"]) for p in served} == {
        (name, v) for name in toolkit["packages"] for v in versions}
    for stanza in served:
        for relation in toolkit["relations"]:
            if relation["package"] == stanza["Package"]:
                wanted = _render(relation["depends"], version=stanza["Version"])
                assert wanted in [d.strip() for d in stanza["Depends"].split(",")]
    k8s = REPOS["kubernetes"]
    minor = k8s["minors"][KUBERNETES_MINOR]
    served = _served(root, _render(k8s["directory"], minor=KUBERNETES_MINOR))
    wanted = {(name, _render(minor["package_version"], upstream=r["upstream"]))
              for name in minor["packages"] for r in minor["releases"]}
    wanted |= {(c["name"], c["version"]) for c in minor["companions"]}
    assert {(p["Package"], p["Version"]) for p in served} == wanted
    for stanza in served:
        depends = [d.strip() for d in stanza.get("Depends", "").split(",") if d.strip()]
        for relation in minor["relations"]:
            if relation["package"] == stanza["Package"] and relation["depends"]:
                assert relation["depends"] in depends, stanza
        if stanza["Package"] == "kubeadm":  # from 1.32 on, none
            assert depends == [], stanza


def _fingerprints(keyfile: Path, tmp_path: Path) -> list[str]:
    listing = subprocess.run(
        ["gpg", "--batch", "--homedir", str(tmp_path), "--with-colons", "--show-keys",
         str(keyfile)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"^pub:[^\n]*\nfpr:{9}([0-9A-F]+):", listing, re.MULTILINE)


def test_lab_publishes_its_key_under_the_vendors_key_file_names(
        lab_repo: tuple[Path, str], tmp_path: Path) -> None:
    root, fingerprint = lab_repo
    keys = [f"compute/cuda/repos/{CUDA[o]['directory']}/{CUDA[o]['key']['file']}"
            for o in LAB_OSES]
    keys += [f"libnvidia-container/{REPOS['nvidia-container-toolkit']['key']['file']}",
             f"{_render(REPOS['kubernetes']['directory'], minor=KUBERNETES_MINOR)}/"
             f"{REPOS['kubernetes']['key']['file']}", "extras/keyring.asc"]
    tmp_path.chmod(0o700)
    for key in keys:
        text = (root / key).read_text()
        assert text.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----"), key
        assert _fingerprints(root / key, tmp_path) == [fingerprint], key
    # The lab's key is its own, never a vendor's: a role default can not trust the lab.
    vendor_keys = {CUDA[o]["key"]["fingerprint"] for o in CUDA}
    vendor_keys |= {REPOS[r]["key"]["fingerprint"] for r in ("nvidia-container-toolkit",
                                                            "kubernetes")}
    assert fingerprint not in vendor_keys


# --- the roles' per-OS tables and the inventories' pins -----------------------------------

def _yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    return data


def _role_os_table(role: str, os_key: str) -> dict[str, Any]:
    return _yaml(ROLES / role / "vars" / f"{ROLE_OS_FILES[os_key]}.yml")


def _defaults(role: str) -> dict[str, Any]:
    return _yaml(ROLES / role / "defaults" / "main.yml")


PREFLIGHT_OS = _yaml(ROLES / "preflight" / "vars" / "main.yml")["preflight_supported_os"]


def _branch_allowed(os_key: str, branch: str) -> bool:
    limits = PREFLIGHT_OS[ROLE_OS_FILES[os_key]]
    return bool(limits.get("driver_branch_min", 0) <= int(branch)
                <= limits.get("driver_branch_max", 9999))


def _pins(inventory: str, os_key: str) -> dict[str, Any]:
    """The bootstrap pins a host of this OS gets from an inventory (all, then its OS group)."""
    base = REPO_ROOT / "inventory" / inventory / "group_vars"
    pins = _yaml(base / "all" / "bootstrap.yml")
    os_group = base / f"os_{os_key.replace('-', '_').replace('.', '_')}" / "bootstrap.yml"
    if os_group.is_file():
        pins.update(_yaml(os_group))
    return pins


def _role_driver_install(os_key: str, pins: dict[str, Any]) -> list[tuple[str, str]]:
    """(package, version) pairs the nvidia_driver role installs, as its vars compute them."""
    table = _role_os_table("nvidia_driver", os_key)
    branch, version = str(pins["nvidia_driver_branch"]), str(pins["nvidia_driver_version"])
    open_modules = pins.get("nvidia_driver_open_kernel_modules",
                            _defaults("nvidia_driver")["nvidia_driver_open_kernel_modules"])
    kernel = table["_nvidia_driver_kernel_packages"]["open" if open_modules else "proprietary"]
    package_version = f"{version}-{table['_nvidia_driver_package_revision']}"
    names = [_render(n, branch=branch) for n in kernel + table["_nvidia_driver_userland_packages"]]
    fm = table["_nvidia_driver_fabricmanager_names"]
    fm_name = _render(fm["from_580"] if int(branch) >= 580 else fm["before_580"], branch=branch)
    fm_version = f"{version}-{table['_nvidia_driver_fabricmanager_revision']}"
    return [(n, package_version) for n in names] + [(fm_name, fm_version)]


INVENTORIES = ("lab", "staging.example", "production.example")


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("os_key", sorted(ROLE_OS_FILES))
def test_every_driver_package_the_roles_install_exists_in_the_os_facts(
        inventory: str, os_key: str) -> None:
    pins = _pins(inventory, os_key)
    if not _branch_allowed(os_key, str(pins["nvidia_driver_branch"])):
        pytest.skip(f"preflight refuses branch {pins['nvidia_driver_branch']} on {os_key}")
    facts = CUDA[os_key]
    assert str(pins["nvidia_driver_version"]) in {
        r["upstream"] for r in facts["driver"]["releases"]}, (inventory, os_key)
    universe = _cuda_universe(os_key) if os_key in LAB_OSES else {
        # Ubuntu: the facts' names for the pinned branch at every release they list.
        (_render(n, branch=r["upstream"].split(".")[0]),
         _render(facts["driver"]["package_version"], upstream=r["upstream"])): "driver"
        for r in facts["driver"]["releases"] for n in facts["driver"]["packages"]}
    fabric = facts["fabricmanager"]
    for release in facts["driver"]["releases"]:
        branch = release["upstream"].split(".")[0]
        universe[(fabric["name_from_580"] if int(branch) >= 580
                  else _render(fabric["name_before_580"], branch=branch),
                  _render(fabric["package_version"], upstream=release["upstream"]))] = "fm"
    for package in _role_driver_install(os_key, pins):
        assert package in universe, (inventory, os_key, package)
    nccl = pins.get("gpu_validation_tools_nccl_version")
    if nccl and os_key in LAB_OSES:
        assert ("libnccl2", nccl) in universe, (inventory, os_key)


@pytest.mark.parametrize("os_key", sorted(ROLE_OS_FILES))
def test_role_os_tables_match_the_repository_facts(os_key: str) -> None:
    table = _role_os_table("nvidia_driver", os_key)
    facts = CUDA[os_key]
    assert f"{table['_nvidia_driver_repo_distro']}/x86_64" == facts["directory"]
    assert table["_nvidia_driver_repo_key_file"] == facts["key"]["file"]
    assert table["_nvidia_driver_repo_key_fingerprint"] == facts["key"]["fingerprint"]
    assert facts["driver"]["package_version"] == (
        "{upstream}-" + table["_nvidia_driver_package_revision"])
    assert table["_nvidia_driver_source_package"] == facts["driver"]["source_package"]
    fm = facts["fabricmanager"]
    assert table["_nvidia_driver_fabricmanager_names"] == {
        "before_580": fm["name_before_580"], "from_580": fm["name_from_580"]}
    assert fm["package_version"] == "{upstream}-" + table["_nvidia_driver_fabricmanager_revision"]
    # Every name the table can install (either flavour) is one the OS's repository carries,
    # except a flavour the facts say is not established there.
    names = set(facts["driver"]["packages"])
    wanted = set(table["_nvidia_driver_userland_packages"])
    for flavour, kernel in table["_nvidia_driver_kernel_packages"].items():
        if flavour == "proprietary" and os_key == "debian-13":
            assert any("nvidia-kernel-dkms" in n for n in facts["driver"]["not_established"])
            continue
        wanted |= set(kernel)
    assert wanted <= names, sorted(wanted - names)


def test_preflight_branch_limits_are_the_repository_facts() -> None:
    first = CUDA["debian-13"]["driver"]["first_branch"]
    assert PREFLIGHT_OS["Debian-13"]["driver_branch_min"] == first
    for os_key in ("ubuntu-22.04", "ubuntu-24.04"):
        limit = PREFLIGHT_OS[ROLE_OS_FILES[os_key]]["driver_branch_max"]
        assert limit == CUDA[os_key]["driver"]["last_branch"]
    assert set(PREFLIGHT_OS) == set(ROLE_OS_FILES.values())


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_toolkit_and_kubernetes_pins_exist_in_their_repositories(inventory: str) -> None:
    pins = _pins(inventory, "debian-12")
    toolkit = REPOS["nvidia-container-toolkit"]
    ctk_defaults = _defaults("nvidia_container_toolkit")
    version = pins.get("nvidia_container_toolkit_version",
                       ctk_defaults["nvidia_container_toolkit_version"])
    assert version in {_render(toolkit["package_version"], upstream=r["upstream"])
                       for r in toolkit["releases"]}
    assert set(ctk_defaults["nvidia_container_toolkit_packages"]) <= set(toolkit["packages"])
    k8s = REPOS["kubernetes"]
    kubelet_defaults = _defaults("kubelet")
    minor = str(pins.get("kubelet_kubernetes_minor", kubelet_defaults["kubelet_kubernetes_minor"]))
    facts = k8s["minors"][minor]
    kubelet_version = pins.get("kubelet_version", kubelet_defaults["kubelet_version"])
    assert kubelet_version in {_render(facts["package_version"], upstream=r["upstream"])
                               for r in facts["releases"]}
    assert set(kubelet_defaults["kubelet_packages"]) <= set(facts["packages"])


def test_role_defaults_pin_the_vendors_real_keys_and_urls() -> None:
    ctk = _defaults("nvidia_container_toolkit")
    toolkit = REPOS["nvidia-container-toolkit"]
    assert ctk["nvidia_container_toolkit_repo_key_fingerprint"] == toolkit["key"]["fingerprint"]
    assert ctk["nvidia_container_toolkit_repo_key_url"] == toolkit["key"]["url"]
    kubelet = _defaults("kubelet")
    k8s = REPOS["kubernetes"]
    assert kubelet["kubelet_repo_key_fingerprint"] == k8s["key"]["fingerprint"]
    minor = "{{ kubelet_kubernetes_minor }}"
    assert kubelet["kubelet_repo_url"] == _render(k8s["url"], minor=minor)
    driver = _defaults("nvidia_driver")
    assert driver["nvidia_driver_repo_base_url"] + "{directory}/" == REPOS["nvidia-cuda"]["url"]
    # Empty means "NVIDIA's key for the host's OS" (the per-OS tables checked above).
    assert driver["nvidia_driver_repo_key_fingerprint"] == ""


# --- Docker's repository (containerd 2, issue 40) -------------------------------------------

@pytest.mark.parametrize("os_key", LAB_OSES)
def test_lab_docker_repository_serves_containerd_io_as_docker_does(
        lab_repo: tuple[Path, str], os_key: str) -> None:
    """Not flat: dists/<suite>/stable/binary-amd64/Packages, the packages in the suite's pool;
    containerd.io at each release the lab builds, with the OS's version suffix, the relations
    of Docker's debian/control and the config.toml its packaging ships (CRI disabled)."""
    from lab.runtime import build  # noqa: PLC0415  (what the lab builds, not what it serves)

    root, _ = lab_repo
    docker = REPOS["docker"]
    suite = docker["os"][os_key]["suite"]
    index = root / docker["directory"] / "dists" / suite / "stable" / "binary-amd64" / "Packages"
    served = _packages_index(index)
    releases = [b.release().removeprefix("v") for b in build.RELEASES]
    assert {(p["Package"], p["Version"]) for p in served} == {
        ("containerd.io", _render(docker["os"][os_key]["version"], upstream=r))
        for r in releases}
    for stanza in served:
        for relation in docker["packages"]["containerd.io"]["relations"]:
            assert stanza[relation["field"]] == relation["value"], stanza
        assert stanza["Filename"].startswith(f"dists/{suite}/pool/stable/amd64/containerd.io_")
        deb = root / docker["directory"] / stanza["Filename"]
        listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True,
                                 text=True, check=True).stdout
        for wanted in docker["packages"]["containerd.io"]["files"]:
            assert f".{wanted['path']}\n" in listing, (wanted["path"], listing)
        assert "./usr/bin/runc\n" in listing
        config = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                                check=True).stdout
        assert b'disabled_plugins = ["cri"]' in config
    release = (root / docker["directory"] / "dists" / suite / "Release").read_text()
    assert f"Suite: {suite}\n" in release and "Components: stable\n" in release
    assert "stable/binary-amd64/Packages\n" in release


@pytest.mark.parametrize("os_key", sorted(ROLE_OS_FILES))
def test_containerd_role_os_tables_match_docker_s_repository(os_key: str) -> None:
    table = _role_os_table("containerd", os_key)
    if os_key not in REPOS["docker"]["os"]:
        assert table["_containerd_vendor_distribution"] == "ubuntu"  # not served in the lab
        return
    facts = REPOS["docker"]["os"][os_key]
    assert table["_containerd_vendor_suite"] == facts["suite"]
    assert _render(facts["version"], upstream="X") == "X-1" + table["_containerd_vendor_suffix"]
    defaults = _defaults("containerd")
    assert defaults["containerd_repo_key_fingerprint"] == REPOS["docker"]["key"]["fingerprint"]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_containerd_pins_are_docker_releases_for_each_os(inventory: str) -> None:
    for os_key in LAB_OSES:
        pins = _pins(inventory, os_key)
        assert pins.get("containerd_source", "vendor") == "vendor", (inventory, os_key)
        version = str(pins["containerd_version"])
        suffix = _render(REPOS["docker"]["os"][os_key]["version"], upstream="")
        assert version.endswith(suffix.removeprefix("-1")), (inventory, os_key, version)
