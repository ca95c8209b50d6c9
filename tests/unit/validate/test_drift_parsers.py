"""dpkg-query and `containerd config dump` parsers on real captures (tests/fixtures/drift-lab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.parsers import ParseError, containerd_config, dpkg_query


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "drift-lab" / name).read_text()


def test_dpkg_converged_node(fixtures_dir: Path) -> None:
    pkgs = dpkg_query.parse(_read(fixtures_dir, "dpkg-query-show-debian12-converged-node.txt"))
    drv = pkgs["nvidia-driver-550"]
    assert (drv.version, drv.want, drv.error, drv.state) == (
        "550.90.07-0ubuntu1", "hold", "ok", "installed")
    assert drv.held and drv.installed and drv.upstream == "550.90.07"
    assert pkgs["containerd"].version == "1.6.20~ds1-1+deb12u3"
    assert not pkgs["containerd"].held
    assert pkgs["containerd"].upstream == "1.6.20~ds1"
    assert len(pkgs) > 200 and all(p.installed for p in pkgs.values())
    # A line dpkg prints for a name it knows but has not installed (dpkg-query -W <name>).
    gone = dpkg_query.parse("nvidia-driver\t\tunknown ok not-installed\n")["nvidia-driver"]
    assert not gone.installed and gone.version == ""


def test_dpkg_downgraded_and_unheld(fixtures_dir: Path) -> None:
    pkgs = dpkg_query.parse(
        _read(fixtures_dir, "dpkg-query-show-debian12-driver-downgraded-unheld.txt"))
    for name in ("nvidia-driver-550", "nvidia-utils-550", "nvidia-dkms-550",
                 "nvidia-compute-utils-550"):
        assert pkgs[name].version == "550.54.15-0ubuntu1" and pkgs[name].want == "install"
    assert pkgs["kubelet"].held


@pytest.mark.parametrize(("version", "upstream"), [
    ("1:550.90.07-0ubuntu1", "550.90.07"), ("2410mlnx54-1.2410068", "2410mlnx54"),
    ("1.30.5-1.1", "1.30.5"), ("6.1", "6.1")])
def test_upstream_version(version: str, upstream: str) -> None:
    assert dpkg_query.upstream_version(version) == upstream


def test_dpkg_rejects_other_shapes() -> None:
    with pytest.raises(ParseError):
        dpkg_query.parse("")
    with pytest.raises(ParseError):
        dpkg_query.parse("ii  containerd 1.6.20 amd64 daemon\n")  # `dpkg -l`, not our format


def test_dpkg_owner() -> None:
    # the real line printed on the lab host (dpkg-query --search /usr/bin/nvidia-smi)
    assert dpkg_query.parse_owner("nvidia-utils-550: /usr/bin/nvidia-smi\n") == [
        "nvidia-utils-550"]
    with pytest.raises(ParseError):
        dpkg_query.parse_owner("dpkg-query: no path found matching pattern /x\n")


def test_containerd_runtimes(fixtures_dir: Path) -> None:
    rts = containerd_config.parse_runtimes(
        _read(fixtures_dir, "containerd-1.6.20-config-dump-nvidia-runtime.toml"))
    assert set(rts) == {"nvidia", "runc"}
    assert rts["nvidia"].binary_name == "/usr/bin/nvidia-container-runtime"
    assert rts["nvidia"].runtime_type == "io.containerd.runc.v2"
    assert rts["runc"].binary_name in (None, "")


def test_containerd_edited_dropin_keeps_the_runtime(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "containerd-1.6.20-config-dump-runc-systemdcgroup-edited.toml")
    assert "nvidia" in containerd_config.parse_runtimes(text)


def test_containerd_without_the_runtime_and_garbage(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "containerd-1.6.20-config-dump-nvidia-runtime.toml")
    # The same real dump with the nvidia tables cut out, as when the drop-in is gone.
    kept, skip = [], False
    for line in text.splitlines():
        if line.strip().startswith("["):
            skip = "runtimes.nvidia" in line
        if not skip:
            kept.append(line)
    assert set(containerd_config.parse_runtimes("\n".join(kept))) == {"runc"}
    with pytest.raises(ParseError):
        containerd_config.parse_runtimes("containerd: failed to load config\n")
