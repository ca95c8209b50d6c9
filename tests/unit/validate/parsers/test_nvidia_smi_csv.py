"""nvidia-smi --query-* CSV parser against real captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.unit.validate.parsers.test_nvidia_smi_golden import capture_sections
from validate.parsers import ParseError
from validate.parsers.nvidia_smi_csv import (
    ComputeApp,
    RetiredPage,
    parse_query_compute_apps,
    parse_query_gpu,
    parse_query_retired_pages,
)

CSV = FIXTURES / "nvidia-smi-csv"
# The field list telegraf asked for in both noheader fixtures (SOURCES.tsv notes).
TELEGRAF_FIELDS = [
    "fan.speed", "memory.total", "memory.used", "memory.free", "pstate", "temperature.gpu",
    "name", "uuid", "compute_mode", "utilization.gpu", "utilization.memory", "index", "power.draw",
]  # fmt: skip
FULL = [
    "h100-80gb-hbm3-query-gpu-full-idle.csv",
    "h100-80gb-hbm3-query-gpu-full-load.csv",
    "h100-mig-query-gpu-full-load.csv",
    "h200-query-gpu-full-load.csv",
    "l40s-query-gpu-full-load.csv",
]


def _read(name: str) -> str:
    return (CSV / name).read_text()


def test_every_csv_fixture_is_covered(fixtures_dir: Path) -> None:
    covered = {
        *FULL,
        "gtx1070ti-query-gpu-noheader-nounits.csv",
        "tesla-p4-query-gpu-noheader-nounits.csv",
        "tesla-p100-query-gpu-header-units.csv",
        "k80-query-gpu-index-power-draw-timestamp-loop.csv",
        "h100-query-compute-apps-load.csv",
        "h100-query-retired-pages.csv",
    }
    assert {p.name for p in (fixtures_dir / "nvidia-smi-csv").iterdir()} == covered


def test_noheader_nounits_gtx1070ti() -> None:
    (row,) = parse_query_gpu(_read("gtx1070ti-query-gpu-noheader-nounits.csv"), TELEGRAF_FIELDS)
    assert row.fields == tuple(TELEGRAF_FIELDS)
    assert [row.value(f) for f in TELEGRAF_FIELDS] == [
        85, 8114, 553, 7561, "P2", 61, "GeForce GTX 1070 Ti",
        "GPU-d1911b8a-f5c8-5e66-057c-486561269de8", "Default", 100, 93, 1, 0.0,
    ]  # fmt: skip


def test_noheader_not_supported_marker_tesla_p4() -> None:
    (row,) = parse_query_gpu(_read("tesla-p4-query-gpu-noheader-nounits.csv"), TELEGRAF_FIELDS)
    assert row.value("fan.speed") is None
    assert row.marker("fan.speed") == "[Not Supported]"
    assert row.raw("fan.speed") == "[Not Supported]"
    assert row.number("fan.speed") is None
    assert row.integer("memory.total") == 7606
    assert row.text("uuid") == "GPU-xxx"
    assert row.number("power.draw") == 0.0


def test_header_units_names_stripped_tesla_p100() -> None:
    (row,) = parse_query_gpu(_read("tesla-p100-query-gpu-header-units.csv"))
    assert row.fields[:5] == ("name", "uuid", "fan.speed", "pstate", "memory.reserved")
    assert row.cell("memory.free").unit == "MiB"
    assert row.value("memory.free") == 16280
    assert row.marker("fan.speed") == "[N/A]"
    assert row.value("power.draw") == pytest.approx(28.16)
    assert row.value("clocks.current.video") == 835
    assert row.value("temperature.gpu") == 37


def test_values_with_units_k80_loop() -> None:
    rows = parse_query_gpu(_read("k80-query-gpu-index-power-draw-timestamp-loop.csv"))
    assert len(rows) == 91
    assert rows[0].value("power.draw") == pytest.approx(16.48)
    assert rows[0].cell("power.draw").unit == "W"
    assert rows[0].raw("power.draw") == "16.48 W"
    assert max(r.number("power.draw") or 0 for r in rows) == pytest.approx(73.24)
    assert {r.value("index") for r in rows} == {0}
    assert rows[0].value("timestamp") == "2022/09/28 15:36:51.68"


@pytest.mark.parametrize("name", FULL)
def test_full_field_list(name: str) -> None:
    (row,) = parse_query_gpu(_read(name))
    header = _read(name).splitlines()[0].split(", ")
    assert len(row.cells) == len(header)
    # identifiers and versions stay text, even when they look numeric
    assert row.value("serial") == "0000000000000"
    assert row.value("inforom.oem") == "2.1"
    assert isinstance(row.value("compute_cap"), str)
    assert row.value("pci.device_id") in {"0x233010DE", "0x233510DE", "0x26B910DE"}
    # deprecated fields are markers, kept as printed
    assert row.value("display_mode") is None
    assert row.marker("display_mode") == "[Requested functionality has been deprecated]"
    assert (
        row.value("fabric.health.summary") is None and row.marker("fabric.health.summary") == "N/A"
    )
    assert row.value("platform.chassis_serial_number") == ""


def test_full_h100_load_values() -> None:
    (row,) = parse_query_gpu(_read("h100-80gb-hbm3-query-gpu-full-load.csv"))
    assert row.value("memory.total") == 81559
    assert row.value("power.draw") == pytest.approx(631.95)
    assert row.value("power.limit") == pytest.approx(700.0)
    assert row.value("utilization.gpu") == 100
    assert row.value("clocks.current.sm") == 1980
    assert row.value("clocks_event_reasons_counters.sw_power_cap") == 0
    assert row.value("edpp_multiplier") == pytest.approx(100.0)
    assert row.value("remapped_rows.pending") == "No"
    assert row.value("retired_pages.pending") is None
    assert row.value("ecc.errors.uncorrected.aggregate.total") == 0
    assert row.value("pcie.link.gen.max") == 5 and row.value("pcie.link.width.max") == 16
    assert row.value("mig.mode.current") == "Disabled"


def test_full_mig_and_l40s() -> None:
    (mig,) = parse_query_gpu(_read("h100-mig-query-gpu-full-load.csv"))
    assert mig.value("mig.mode.current") == "Enabled"
    (l40s,) = parse_query_gpu(_read("l40s-query-gpu-full-load.csv"))
    assert l40s.value("name") == "NVIDIA L40S"
    assert l40s.value("kmd_version") == "595.80"
    assert l40s.value("memory.total") == 46068


def test_compute_apps() -> None:
    apps = parse_query_compute_apps(_read("h100-query-compute-apps-load.csv"))
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    assert apps == [
        ComputeApp(uuid, "00000000:00:09.0", 11327, "/root/tools/memhog", 2566),
        ComputeApp(uuid, "00000000:00:09.0", 11328, "/root/tools/memhog", 1542),
        ComputeApp(uuid, "00000000:00:09.0", 11345, "./gpu_burn", 15690),
    ]


def test_compute_apps_header_only_means_none() -> None:
    capture = FIXTURES / "nvidia-smi-captures/linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    idle = capture_sections(capture)["idle :: query-compute-apps (per-process)"]
    assert parse_query_compute_apps(idle) == []


def test_retired_pages_na_on_hopper() -> None:
    pages = parse_query_retired_pages(_read("h100-query-retired-pages.csv"))
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    assert pages == [
        RetiredPage(uuid, "00000000:00:09.0", None, None, "Single Bit ECC"),
        RetiredPage(uuid, "00000000:00:09.0", None, None, "Double Bit ECC"),
    ]


@pytest.mark.parametrize(
    "capture", sorted(FIXTURES.glob("nvidia-smi-captures/*.txt")), ids=lambda p: p.name
)
def test_capture_csv_sections(capture: Path) -> None:
    sections = capture_sections(capture)
    for phase in ("idle", "load"):
        (row,) = parse_query_gpu(sections[f"{phase} :: query-gpu (csv, what the exporter parses)"])
        assert row.value("count") == 1
        assert isinstance(row.value("memory.total"), int)
        parse_query_compute_apps(sections[f"{phase} :: query-compute-apps (per-process)"])
        parse_query_retired_pages(sections[f"{phase} :: query-retired-pages"])


@pytest.mark.parametrize(
    "text",
    ["", "\n  \n", "hello world\n", "<html>502 Bad Gateway</html>\n", "name, memory.total [MiB]\n"],
)
def test_rejects_garbage_and_empty(text: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_query_gpu(text)
    assert info.value.fmt == "nvidia-smi-csv"


def test_rejects_truncated_row() -> None:
    text = _read("h100-80gb-hbm3-query-gpu-full-load.csv")
    with pytest.raises(ParseError, match="cells"):
        parse_query_gpu(text[: len(text) - 400])


def test_rejects_unit_field_with_text() -> None:
    with pytest.raises(ParseError, match="MiB"):
        parse_query_gpu("name, memory.total [MiB]\nGPU, lots\n")


def test_rejects_wrong_field_count_without_header() -> None:
    with pytest.raises(ParseError):
        parse_query_gpu(_read("tesla-p4-query-gpu-noheader-nounits.csv"), TELEGRAF_FIELDS[:5])


def test_compute_apps_empty_text_is_an_error() -> None:
    with pytest.raises(ParseError):
        parse_query_compute_apps("")
