"""nvidia-smi -q -x (XML) and -q (text) parsers against real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.unit.validate.parsers.test_nvidia_smi_golden import (
    capture_sections,
    load_expected,
    to_jsonable,
)
from validate.parsers import ParseError, nvidia_smi_q, nvidia_smi_xml
from validate.parsers.nvidia_smi_csv import parse_query_gpu
from validate.parsers.nvidia_smi_model import EccErrors, RemappedRows, RetiredPages

XML_FIXTURES = sorted(FIXTURES.glob("nvidia-smi-xml/*.xml"))
Q_FIXTURES = sorted(FIXTURES.glob("nvidia-smi-q-text/*.txt"))
CAPTURES = sorted(FIXTURES.glob("nvidia-smi-captures/*.txt"))


def test_every_fixture_is_covered(fixtures_dir: Path) -> None:
    assert len(XML_FIXTURES) == 10
    assert len(Q_FIXTURES) == 13
    assert len(CAPTURES) == 5


@pytest.mark.parametrize("fixture", XML_FIXTURES, ids=lambda p: p.name)
def test_xml_golden(fixture: Path) -> None:
    assert to_jsonable(nvidia_smi_xml.parse(fixture.read_text())) == load_expected("xml", fixture)


@pytest.mark.parametrize("fixture", Q_FIXTURES, ids=lambda p: p.name)
def test_q_golden(fixture: Path) -> None:
    assert to_jsonable(nvidia_smi_q.parse(fixture.read_text())) == load_expected("q", fixture)


def _xml(name: str) -> nvidia_smi_xml.NvidiaSmiLog:
    return nvidia_smi_xml.parse((FIXTURES / "nvidia-smi-xml" / name).read_text())


def _q(name: str) -> nvidia_smi_q.NvidiaSmiLog:
    return nvidia_smi_q.parse((FIXTURES / "nvidia-smi-q-text" / name).read_text())


# --- XML: the differences across DTD versions ---------------------------------------------


def test_xml_v11_throttle_reasons_and_old_ecc_layout() -> None:
    log = _xml("tesla-p100-pcie-16gb-drv510-v11.xml")
    gpu = log.gpus[0]
    assert (log.driver_version, log.cuda_version, log.attached_gpus) == ("510.47.03", "11.6", 1)
    assert gpu.clock_event_reasons_active == ("gpu_idle",)  # from clocks_throttle_reasons
    # single_bit/double_bit layout: aggregate single-bit device_memory 3 -> total 3
    assert gpu.ecc == EccErrors(0, 0, 3, 0, None, None)
    assert gpu.retired_pages == RetiredPages(sbe=0, dbe=0, pending=False)
    assert gpu.remapped_rows is None  # <remapped_rows>N/A</remapped_rows>
    assert (gpu.pcie_gen_max, gpu.pcie_width_max) == (3, 16)


def test_xml_v12_event_reasons_and_sram_dram_layout() -> None:
    log = _xml("a100-sxm4-80gb-x4-drv535-v12.xml")
    gpu = log.gpus[0]
    # attached_gpus says 4 but the published file holds one <gpu>: both facts are kept.
    assert (log.attached_gpus, len(log.gpus)) == (4, 1)
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.mig_mode == "Enabled"
    assert gpu.memory_total_mib == 81920
    assert gpu.ecc == EccErrors(0, 0, 0, 0, 0, 0)
    assert gpu.retired_pages is None  # every field N/A on Ampere
    assert gpu.power_draw_w == pytest.approx(67.03)
    assert gpu.power_limit_w == pytest.approx(500.0)


def test_xml_v13_average_power_and_split_sram() -> None:
    log = _xml("rtx-a5000-x2-drv590-v13.xml")
    assert [g.pci_bus_id for g in log.gpus] == ["00000000:81:00.0", "00000000:C1:00.0"]
    gpu = log.gpus[0]
    assert gpu.power_draw_w == pytest.approx(6.41)  # average_power_draw in v13
    assert gpu.pcie_gen_current == 1 and gpu.pcie_gen_max == 4
    assert gpu.ecc_mode == "Disabled"
    assert gpu.ecc == EccErrors(None, None, None, None, None, None)
    assert gpu.remapped_rows == RemappedRows(0, 0, pending=False, failure=False)


def test_xml_mig_volatile_na_is_none_not_zero() -> None:
    gpu = _xml("a100-sxm4-40gb-mig-drv510-v11.xml").gpus[0]
    assert gpu.ecc is not None
    assert gpu.ecc.volatile_uncorrectable is None
    assert gpu.ecc.aggregate_uncorrectable == 0


def test_xml_vgpu_guest_has_mostly_unknowns() -> None:
    gpu = _xml("grid-p4-1q-vgpu-drv513-windows-v11.xml").gpus[0]
    assert gpu.name == "GRID P4-1Q"
    assert gpu.pcie_gen_max is None and gpu.power_draw_w is None
    assert gpu.memory_total_mib == 1024


# --- -q text: faults and excerpts ---------------------------------------------------------


def test_q_remapped_rows_pending_fault_excerpt() -> None:
    log = _q("a100-sxm4-80gb-remapped-rows-pending-dram-correctable-excerpt.txt")
    gpu = log.gpus[0]
    assert log.driver_version == "510.73.08" and log.attached_gpus == 8
    assert gpu.pci_bus_id == "00000000:10:1C.0"
    assert gpu.remapped_rows == RemappedRows(1, 0, pending=True, failure=False)
    assert gpu.ecc == EccErrors(177, 0, 177, 0, 0, 0)


def test_q_sram_uncorrectable_excerpt_without_gpu_header() -> None:
    log = _q("sram-uncorrectable-ecc-errors-excerpt.txt")
    assert log.driver_version is None and log.attached_gpus is None
    (gpu,) = log.gpus
    assert gpu.pci_bus_id is None
    assert gpu.ecc == EccErrors(0, 1, 0, 5, 1, 5)


def test_q_page_retirement_faulted() -> None:
    log = _q("a100-x8-azure-q-d-page-retirement-faulted-TESTFIXTURE.txt")
    assert [g.pci_bus_id for g in log.gpus] == [f"0000000{n}:00:00.0" for n in range(1, 9)]
    assert [g.retired_pages for g in log.gpus] == [
        RetiredPages(60, 5, False),
        RetiredPages(2, 61, True),
        RetiredPages(0, 0, False),
        RetiredPages(6, 0, True),
        RetiredPages(0, 0, False),
        RetiredPages(20, 45, True),
        RetiredPages(0, 0, False),
        RetiredPages(8, 56, True),
    ]


def test_q_page_retirement_clean() -> None:
    log = _q("a100-x8-azure-q-d-page-retirement-clean.txt")
    assert len(log.gpus) == 8
    assert {g.retired_pages for g in log.gpus} == {RetiredPages(0, 0, False)}
    assert all(g.name is None and g.ecc is None for g in log.gpus)


def test_q_a10_uncorrectable_remap_pending() -> None:
    gpu = _q("a10-drv535.129.03-full.txt").gpus[0]
    assert gpu.remapped_rows == RemappedRows(0, 4, pending=True, failure=False)
    assert gpu.name == "NVIDIA A10" and gpu.memory_total_mib == 23028


def test_q_hgx_h100_eight_gpus_hw_slowdown() -> None:
    log = _q("h100-80gb-hbm3-x8-drv535.161.08-full.txt")
    assert log.driver_version == "535.161.08" and len(log.gpus) == 8
    assert [g.index for g in log.gpus] == list(range(8))
    assert len({g.uuid for g in log.gpus}) == 8
    assert all(g.pcie_gen_max == 5 and g.pcie_width_max == 16 for g in log.gpus)
    # nested "HW Power Brake Slowdown" under "HW Slowdown" is read too
    assert log.gpus[0].clock_event_reasons_active == ("hw_slowdown", "hw_power_brake_slowdown")


def test_q_mig_reads_gpu_sections_not_mig_device_ones() -> None:
    gpu = _q("h100-80gb-hbm3-mig-drv590-load.txt").gpus[0]
    assert gpu.mig_mode == "Enabled"
    assert gpu.remapped_rows is None  # "Remapped Rows : N/A" in MIG mode
    assert gpu.memory_total_mib == 81559  # the GPU's FB, not a MIG device's 40448 MiB share
    assert gpu.ecc == EccErrors(0, 0, 0, 0, 0, 0)


def test_q_h800_single_gpu_of_eight() -> None:
    log = _q("h800-sxm-gpu0-drv525-q-i0.txt")
    assert (log.attached_gpus, len(log.gpus)) == (8, 1)
    assert log.gpus[0].module_id == 5 and log.gpus[0].ecc_mode is None


# --- both formats, same facts -------------------------------------------------------------


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_capture_q_sections_parse_and_agree_with_csv(capture: Path) -> None:
    sections = capture_sections(capture)
    for phase in ("idle", "load"):
        log = nvidia_smi_q.parse(sections[f"{phase} :: query (-q)"])
        (row,) = parse_query_gpu(sections[f"{phase} :: query-gpu (csv, what the exporter parses)"])
        gpu = log.gpus[0]
        assert log.driver_version == row.value("driver_version")
        assert gpu.name == row.value("name")
        assert gpu.uuid == row.value("uuid")
        assert gpu.pci_bus_id == row.value("pci.bus_id")
        assert gpu.memory_total_mib == row.value("memory.total")
        assert gpu.pcie_gen_max == row.value("pcie.link.gen.max")
        assert gpu.pcie_width_max == row.value("pcie.link.width.max")
        assert gpu.mig_mode == row.value("mig.mode.current")
        assert gpu.ecc is not None
        assert gpu.ecc.aggregate_uncorrectable == row.value(
            "ecc.errors.uncorrected.aggregate.total"
        )


def test_capture_q_section_equals_standalone_fixture() -> None:
    capture = FIXTURES / "nvidia-smi-captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    from_capture = nvidia_smi_q.parse(capture_sections(capture)["idle :: query (-q)"])
    assert from_capture == _q("h100-80gb-hbm3-sxm-vm-drv590-idle.txt")


# --- errors -------------------------------------------------------------------------------

GARBAGE = [
    "",
    "   \n\n",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "hello world\n",
    "key : value\nother : thing\n",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_q_rejects_garbage(text: str) -> None:
    with pytest.raises(ParseError) as info:
        nvidia_smi_q.parse(text)
    assert info.value.fmt == "nvidia-smi-q"


def test_q_rejects_real_nodriver_output(fixtures_dir: Path) -> None:
    for path in sorted((fixtures_dir / "nvidia-smi-nodriver").iterdir()):
        with pytest.raises(ParseError):
            nvidia_smi_q.parse(path.read_text())


def test_q_rejects_truncated_log() -> None:
    text = (FIXTURES / "nvidia-smi-q-text/a10-drv535.129.03-full.txt").read_text()
    cut = text[: text.index("    ECC Errors") + len("    ECC Errors")]
    with pytest.raises(ParseError, match="truncated"):
        nvidia_smi_q.parse(cut)


def test_q_rejects_cut_mid_value_that_is_not_a_number() -> None:
    text = "GPU 00000000:01:00.0\n    FB Memory Usage\n        Total : 81559 Mi\n"
    with pytest.raises(ParseError):
        nvidia_smi_q.parse(text)


@pytest.mark.parametrize("text", [*GARBAGE, "<html><body>502</body></html>", "<nvidia_smi_log>"])
def test_xml_rejects_garbage(text: str) -> None:
    with pytest.raises(ParseError) as info:
        nvidia_smi_xml.parse(text)
    assert info.value.fmt == "nvidia-smi-xml"


def test_xml_rejects_truncated_document() -> None:
    text = (FIXTURES / "nvidia-smi-xml/tesla-t4-drv515-v11.xml").read_text()
    with pytest.raises(ParseError, match="well-formed"):
        nvidia_smi_xml.parse(text[: len(text) // 2])


def test_xml_refuses_entity_declarations() -> None:
    bomb = (
        '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>\n'
        "<nvidia_smi_log><driver_version>&b;</driver_version></nvidia_smi_log>"
    )
    with pytest.raises(ParseError, match="entities"):
        nvidia_smi_xml.parse(bomb)


@pytest.mark.parametrize("bad", ["nan W", "inf W", "-inf W", "NaN W"])
def test_non_finite_numbers_are_rejected(fixtures_dir: Path, bad: str) -> None:
    xml = (fixtures_dir / "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml").read_text()
    assert "<power_draw>67.03 W</power_draw>" in xml
    with pytest.raises(ParseError, match="not a finite number"):
        nvidia_smi_xml.parse(xml.replace("<power_draw>67.03 W</power_draw>",
                                         f"<power_draw>{bad}</power_draw>", 1))
    text = (fixtures_dir / "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt").read_text()
    line = "        Power Draw                        : 67.74 W"
    assert line in text
    with pytest.raises(ParseError, match="not a finite number"):
        nvidia_smi_q.parse(text.replace(line, line.replace("67.74 W", bad), 1))
