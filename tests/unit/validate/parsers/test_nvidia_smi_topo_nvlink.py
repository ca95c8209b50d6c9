"""nvidia-smi topo and nvlink parsers against real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.unit.validate.parsers.test_nvidia_smi_golden import (
    capture_sections,
    load_expected,
    to_jsonable,
)
from validate.parsers import ParseError, nvidia_smi_nvlink, nvidia_smi_topo

TOPO = sorted(FIXTURES.glob("nvidia-smi-topo/*.txt"))
NVLINK = sorted(FIXTURES.glob("nvidia-smi-nvlink/*.txt"))
CAPTURES = sorted(FIXTURES.glob("nvidia-smi-captures/*.txt"))


def _topo(name: str) -> nvidia_smi_topo.TopoMatrix:
    return nvidia_smi_topo.parse((FIXTURES / "nvidia-smi-topo" / name).read_text())


def _nvlink(name: str) -> tuple[nvidia_smi_nvlink.GpuNvlinks, ...]:
    return nvidia_smi_nvlink.parse((FIXTURES / "nvidia-smi-nvlink" / name).read_text())


def test_every_fixture_is_covered(fixtures_dir: Path) -> None:
    assert len(TOPO) == 10 and len(NVLINK) == 8


@pytest.mark.parametrize("fixture", TOPO, ids=lambda p: p.name)
def test_topo_golden(fixture: Path) -> None:
    assert to_jsonable(nvidia_smi_topo.parse(fixture.read_text())) == load_expected("topo", fixture)


@pytest.mark.parametrize("fixture", NVLINK, ids=lambda p: p.name)
def test_nvlink_golden(fixture: Path) -> None:
    got = to_jsonable(nvidia_smi_nvlink.parse(fixture.read_text()))
    assert got == load_expected("nvlink", fixture)


# --- topo ---------------------------------------------------------------------------------


def test_topo_b200_nv18_nic_legend_and_gpu_numa_id() -> None:
    topo = _topo("b200-8gpu-nv18-8nic-legend-gpu-numa-id-gke-a4-docspaces.txt")
    assert topo.kind == "link"
    assert [d.name for d in topo.gpus] == [f"GPU{i}" for i in range(8)]
    assert [d.nic_name for d in topo.nics] == [f"mlx5_{i}" for i in range(8)]
    assert all(topo.nvlink_count(a, b) == 18 for a in range(8) for b in range(8) if a != b)
    assert topo.nvlink_count(0, 0) == 0
    assert topo.link("GPU0", "mlx5_0") == "PIX" == topo.link("GPU0", "NIC1")
    assert topo.link("GPU3", "NIC2") == "PIX" and topo.link("GPU3", "NIC4") == "SYS"
    gpu0, gpu4 = topo.device(0), topo.device(4)
    assert (gpu0.cpu_affinity, gpu0.numa_affinity, gpu0.gpu_numa_id) == ("0-55,112-167", "0", "N/A")
    assert (gpu4.cpu_affinity, gpu4.numa_affinity) == ("56-111,168-223", "1")
    assert topo.device("NIC0").cpu_affinity is None


def test_topo_nv2_pair_doc_spaces_without_legend() -> None:
    topo = _topo("2gpu-nv2-docspaces.txt")
    assert topo.nvlink_count(0, 1) == 2 == topo.nvlink_count(1, 0)
    assert topo.device(1).cpu_affinity == "0-23" and topo.device(1).numa_affinity == "N/A"
    assert topo.legend == () and topo.nics == ()


def test_topo_doc_spaces_same_as_tabs_shape() -> None:
    topo = _topo("h100-sxm-8gpu-nv18-ht-affinity-docspaces.txt")
    assert topo.device(5).cpu_affinity == "52-103,156-207"
    assert topo.device(5).numa_affinity == "1"
    assert topo.nvlink_count(2, 7) == 18
    assert topo.legend == ()


def test_topo_a100_tabs_nic_legend_four_numa_nodes() -> None:
    topo = _topo("a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt")
    assert len(topo.gpus) == 8 and len(topo.nics) == 10
    assert topo.link("GPU0", "mlx5_0") == "PXB" == topo.link("GPU7", "NIC7")
    assert topo.link("mlx5_8", "mlx5_9") == "PIX"
    assert [g.numa_affinity for g in topo.gpus] == ["3", "3", "1", "1", "7", "7", "5", "5"]
    assert topo.device(2).cpu_affinity == "16-31,144-159"
    assert topo.nvlink_count("GPU6", "GPU1") == 12
    # NIC rows end with empty affinity cells; they read as no affinity, not as a value.
    assert topo.device("NIC9").cpu_affinity is None and topo.device("NIC9").numa_affinity is None
    assert dict(topo.legend)["NV#"] == "Connection traversing a bonded set of # NVLinks"


def test_topo_pcie_only_pair_has_no_nvlinks() -> None:
    topo = _topo("2gpu-phb-pcie-only-no-nvlink-docspaces.txt")
    assert topo.kind == "link"
    assert topo.link(0, 1) == "PHB"
    assert topo.nvlink_count(0, 1) == 0


def test_topo_single_gpu_ansi_stripped() -> None:
    for name in ("h100-single-gpu-vm-topo-m-ansi.txt", "l40s-single-gpu-topo-m-ansi.txt"):
        topo = _topo(name)
        assert topo.kind == "link"
        (gpu,) = topo.devices
        assert gpu.name == "GPU0" and gpu.numa_affinity == "0" and gpu.gpu_numa_id == "N/A"
    assert _topo("l40s-single-gpu-topo-m-ansi.txt").device(0).cpu_affinity == "0-7"


def test_topo_p2p_ok_and_cns() -> None:
    ok = _topo("h100-8gpu-topo-p2p-r-ok.txt")
    assert ok.kind == "p2p"
    assert {ok.link(a, b) for a in range(8) for b in range(8) if a != b} == {"OK"}
    cns = _topo("l4-2gpu-topo-p2p-r-cns.txt")
    assert cns.link(0, 1) == "CNS" and cns.kind == "p2p"
    with pytest.raises(ValueError):
        cns.nvlink_count(0, 1)


def test_topo_unknown_device_is_key_error() -> None:
    with pytest.raises(KeyError):
        _topo("2gpu-nv2-docspaces.txt").link(0, 9)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_topo_capture_sections(capture: Path) -> None:
    topo = nvidia_smi_topo.parse(capture_sections(capture)["capabilities :: topo -m"])
    assert [d.name for d in topo.devices] == ["GPU0"]


@pytest.mark.parametrize(
    "text", ["", "  \n", "hello\n", "\tGPU0\tGPU1\nGPU0\t X \tNV4\n", "\tGPU0\tGPU1\n"]
)
def test_topo_rejects_garbage_and_truncated(text: str) -> None:
    with pytest.raises(ParseError) as info:
        nvidia_smi_topo.parse(text)
    assert info.value.fmt == "nvidia-smi-topo"


def test_topo_rejects_truncated_fixture_and_bad_cells() -> None:
    text = (
        FIXTURES / "nvidia-smi-topo/a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt"
    ).read_text()
    with pytest.raises(ParseError, match="truncated"):
        nvidia_smi_topo.parse(text[: text.index("NIC3\tSYS")])
    with pytest.raises(ParseError, match="unknown link"):
        nvidia_smi_topo.parse(text.replace("NV12", "NVX", 1))
    with pytest.raises(ParseError, match="diagonal"):
        nvidia_smi_topo.parse(text.replace("GPU0\t X ", "GPU0\tNV12", 1))


# --- nvlink -------------------------------------------------------------------------------


def test_nvlink_h100_18_links() -> None:
    (gpu,) = _nvlink("h100-sxm-nvlink-s-18links.txt")
    assert gpu.status == "ok" and gpu.active_links == 18
    assert {link.speed_gbps for link in gpu.links} == {26.562}
    assert [link.link for link in gpu.links] == list(range(18))


def test_nvlink_a100_all_gpus() -> None:
    gpus = _nvlink("a100-x8-nvlink-status-all-gpus.txt")
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.active_links == 12 for g in gpus)
    assert gpus[0].uuid == "GPU-5269b708-678a-b1a8-60f0-c90406537486"


def test_nvlink_indent_variants_agree() -> None:
    tab = _nvlink("a100-sxm4-80gb-nvlink-s-12links-ok.txt")[0]
    spaces = _nvlink("a100-p4de-gpu0-nvlink-s-two-space-indent.txt")[0]
    assert (tab.index, spaces.index) == (7, 0)
    assert tab.links == spaces.links
    assert tab.name == spaces.name == "NVIDIA A100-SXM4-80GB"


def test_nvlink_faults_and_no_nvlink() -> None:
    (inactive,) = _nvlink("a100-sxm4-80gb-nvlink-s-all-links-inactive.txt")
    assert (inactive.index, inactive.status, inactive.active_links) == (6, "all-inactive", 0)
    assert inactive.message is not None and "inactive" in inactive.message
    (mig,) = _nvlink("h100-mig-nvlink-s-unsupported.txt")
    assert mig.status == "mig" and mig.links == ()
    (l40s,) = _nvlink("l40s-nvlink-s-no-nvlink.txt")
    assert l40s.status == "unsupported"
    assert _nvlink("a10-nvlink-status-empty-output.txt") == ()


def test_nvlink_single_inactive_link() -> None:
    # Per-link "<inactive>" as recent drivers print it for one downed link (nvlink-down fault).
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n"
        "\t Link 0: 26.562 GB/s\n"
        "\t Link 1: <inactive>\n"
    )
    (gpu,) = nvidia_smi_nvlink.parse(text)
    assert gpu.active_links == 1 and gpu.links[1].speed_gbps is None


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_nvlink_capture_sections(capture: Path) -> None:
    (gpu,) = nvidia_smi_nvlink.parse(capture_sections(capture)["capabilities :: nvlink -s"])
    expected = {"h100-80gb": "ok", "h200__": "ok", "mig": "mig", "l40s": "unsupported"}
    assert gpu.status == next(v for k, v in expected.items() if k in capture.name)


@pytest.mark.parametrize(
    "text",
    [
        "hello\n",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-370ec676\n",
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n",
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n\t Link 0: 25 GB/s\n\t Link 1\n",
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n\t Link 0: 25 GB/s\n\t Link 2: 25 GB/s\n",
    ],
)
def test_nvlink_rejects_garbage_and_truncated(text: str) -> None:
    with pytest.raises(ParseError) as info:
        nvidia_smi_nvlink.parse(text)
    assert info.value.fmt == "nvidia-smi-nvlink"
