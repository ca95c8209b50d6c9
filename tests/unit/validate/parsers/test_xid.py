"""Xid kernel-log parser and catalog against the real captures in fixtures/dmesg-xid and syslog."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from validate import xid_catalog
from validate.parsers import ParseError, xid
from validate.parsers.xid import XidEvent

XID13_LOG = "xid13-xid43-dmesg-decode-iso-635-lines.log"


def _read(fixtures_dir: Path, *parts: str) -> str:
    return fixtures_dir.joinpath(*parts).read_text()


def test_dmesg_decode_iso_xid13_xid43(fixtures_dir: Path) -> None:
    events = xid.parse(_read(fixtures_dir, "dmesg-xid", XID13_LOG))
    assert len(events) == 636
    assert Counter(e.xid for e in events) == {13: 629, 43: 7}
    assert {e.pci_bus_id for e in events} == {"0000:38:00"}
    assert events[0] == XidEvent(
        xid=13,
        pci_bus_id="0000:38:00",
        timestamp=datetime(2025, 1, 21, 2, 21, 33, 498559, tzinfo=UTC),
        uptime_s=None,
        host=None,
        pid=None,  # pid='<unknown>'
        process=None,  # name=<unknown>
        message="Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address",
    )
    first_43 = next(e for e in events if e.xid == 43)
    assert (first_43.pid, first_43.process, first_43.message) == (
        2815167,
        "pt_main_thread",
        "Ch 00000008",
    )
    assert first_43.timestamp == datetime(2025, 1, 21, 2, 21, 33, 502278, tzinfo=UTC)
    assert events[-1].timestamp == datetime(2025, 1, 21, 4, 41, 44, 287197, tzinfo=UTC)
    assert all(e.timestamp is not None for e in events)
    # Xid 13/43 are the application's fault: info, never a reason to drain the node.
    assert {e.info.severity for e in events} == {"info"}


def test_bare_line_without_prefix(fixtures_dir: Path) -> None:
    (event,) = xid.parse(_read(fixtures_dir, "dmesg-xid", "xid63-row-remapper-new-row-marked.txt"))
    assert event == XidEvent(
        xid=63,
        pci_bus_id="0000:10:1c",
        timestamp=None,
        uptime_s=None,
        host=None,
        pid=1896,
        process=None,
        message="Row Remapper: New row marked for remapping, reset gpu to activate.",
    )
    assert event.info.severity == "warning"
    assert event.info.action.startswith("RESET_GPU")


@pytest.mark.parametrize(
    ("parts"),
    [
        ("dmesg-xid", "boot-dmesg-decode-iso-mlx5-insufficient-pcie-power.log"),
        ("syslog", "ib6-link-flap-syslog.txt"),
    ],
)
def test_logs_without_xid_have_no_events(fixtures_dir: Path, parts: tuple[str, str]) -> None:
    text = _read(fixtures_dir, *parts)
    assert len(text) > 1000  # a real log, not an empty file
    assert xid.parse(text) == ()


def _payload(fixtures_dir: Path) -> str:
    """The real Xid 43 payload from the decode log, without its dmesg prefix."""
    line = next(
        raw for raw in _read(fixtures_dir, "dmesg-xid", XID13_LOG).splitlines() if "): 43," in raw
    )
    return line[line.index("NVRM: Xid") :]


def test_every_prefix_the_collectors_produce(fixtures_dir: Path) -> None:
    payload = _payload(fixtures_dir)
    tz_utc = timezone(timedelta(0))
    cases = {
        f"[ 8123.456789] {payload}": (None, 8123.456789, None),
        f"[Tue Jan 21 02:21:33 2025] {payload}": (datetime(2025, 1, 21, 2, 21, 33), None, None),
        f"2025-01-21T02:21:33,502278+00:00 {payload}": (
            datetime(2025, 1, 21, 2, 21, 33, 502278, tzinfo=tz_utc),
            None,
            None,
        ),
        f"kern  :warn  : [ 8123.456789] {payload}": (None, 8123.456789, None),
        f"2025-01-21T02:21:33+0000 gpu-h100-01 kernel: {payload}": (
            datetime(2025, 1, 21, 2, 21, 33, tzinfo=tz_utc),
            None,
            "gpu-h100-01",
        ),
        f"2025-01-21T02:21:33.502278+01:00 gpu-h100-01 kernel: {payload}": (
            datetime(2025, 1, 21, 2, 21, 33, 502278, tzinfo=timezone(timedelta(hours=1))),
            None,
            "gpu-h100-01",
        ),
        f"Jan 21 02:21:33 gpu-a100-03 kernel: [ 8123.456789] {payload}": (
            None,
            8123.456789,
            "gpu-a100-03",
        ),
    }
    for line, (timestamp, uptime, host) in cases.items():
        (event,) = xid.parse(line)
        assert (event.timestamp, event.uptime_s, event.host) == (timestamp, uptime, host), line
        assert (event.xid, event.pid, event.process, event.message) == (
            43,
            2815167,
            "pt_main_thread",
            "Ch 00000008",
        ), line


def test_journal_noise_and_other_kernel_lines_are_ignored(fixtures_dir: Path) -> None:
    payload = _payload(fixtures_dir)
    text = "\n".join(
        [
            "-- Logs begin at Tue 2025-01-21 00:00:00 UTC, end at Tue 2025-01-21 03:00:00 UTC. --",
            "2025-01-21T02:21:30+0000 gpu-h100-01 kernel: NVRM: GPU at PCI:0000:38:00: GPU-1234",
            f"2025-01-21T02:21:33+0000 gpu-h100-01 kernel: {payload}",
            "-- No entries --",
        ]
    )
    (event,) = xid.parse(text)
    assert event.pci_bus_id == "0000:38:00"


def test_old_driver_line_without_pci_prefix_or_pid() -> None:
    # Format of drivers before the "PCI:" prefix (seen in public kernel logs).
    (event,) = xid.parse("[  269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007")
    assert (event.xid, event.pci_bus_id, event.pid, event.message) == (
        3,
        "0000:01:00",
        None,
        "C 00000005 SC 00000007",
    )
    assert event.info.summary.startswith("Xid 3")  # not in our catalog


def test_empty_input_is_zero_events() -> None:
    assert xid.parse("") == ()
    assert xid.parse("\n\n") == ()


def test_line_cut_mid_event_is_an_error(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "dmesg-xid", XID13_LOG)
    cut = text[: text.index("NVRM: Xid (PCI:0000:38:00): 43") + len("NVRM: Xid (PCI:0000:3")]
    with pytest.raises(ParseError, match="incomplete Xid line") as info:
        xid.parse(cut)
    assert info.value.fmt == "xid"


def test_binary_garbage_is_an_error() -> None:
    with pytest.raises(ParseError, match="binary"):
        xid.parse("\x7fELF\x02\x01\x01\x00\x00\x00")


REQUIRED_CODES = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 140)


def test_catalog_covers_the_common_codes() -> None:
    for code in REQUIRED_CODES:
        info = xid_catalog.XID_CATALOG[code]
        assert info.severity in ("critical", "warning", "info")
        assert info.summary and info.action


@pytest.mark.parametrize(
    ("code", "severity"),
    [
        (13, "info"),
        (31, "info"),
        (43, "info"),
        (48, "critical"),
        (63, "warning"),
        (64, "critical"),
        (74, "critical"),
        (79, "critical"),
        (92, "warning"),
        (94, "warning"),
        (95, "critical"),
        (119, "critical"),
    ],
)
def test_catalog_severity_policy(code: int, severity: str) -> None:
    assert xid_catalog.lookup(code).severity == severity


def test_catalog_unknown_code() -> None:
    info = xid_catalog.lookup(9999)
    assert info.severity == "warning"
    assert xid_catalog.CATALOG_URL in info.action
