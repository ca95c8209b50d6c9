"""InfiniBand error counters (issue 31): the validators' sysfs read on a real sysfs tree, the
judgement of growth since the previous run, the run history it reads, and the lab's simulated
counters held to the real layout."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lab.hardware import render_host, write_hardware, write_ib_counters
from tests.conftest import FIXTURES
from tests.ttar import unpack
from validate.checks.fabric import GROWING, judge_ib_counters
from validate.history import last_values
from validate.model import CheckResult, Status
from validate.parsers import ParseError, ib_counters
from validate.profiles import load_profile
from validate.results import results_table, to_frame

TREE = FIXTURES / "sysfs-infiniband/procfs-testdata-sys-class-infiniband-hfi1-mlx4-2port-mlx5.ttar"
CHECK = "fabric.ib_counters"


def _read(root: Path) -> str:
    """The validators' own command, run here on ``root`` as it runs on a node."""
    proc = subprocess.run(["sh", "-c", ib_counters.READ_COUNTERS, "sh", str(root)],
                          capture_output=True, text=True, check=False, timeout=30)
    assert proc.returncode == 0 and proc.stderr == "", proc
    return proc.stdout


@pytest.fixture
def real_sys(tmp_path: Path) -> Path:
    return unpack(TREE, tmp_path / "sys", strip="fixtures/sys/")


def test_the_command_reads_a_real_sysfs_tree(real_sys: Path) -> None:
    ports = ib_counters.parse(_read(real_sys))
    assert [p.name for p in ports] == ["hfi1_0/1", "mlx4_0/1", "mlx4_0/2", "mlx5_0/1"]
    for port in ports:
        assert port.counters == dict.fromkeys(ib_counters.ERROR_COUNTERS, 0)


def test_a_node_without_hcas_reads_no_port(tmp_path: Path) -> None:
    assert ib_counters.parse(_read(tmp_path)) == ()


def test_no_pma_and_garbage(real_sys: Path) -> None:
    # A port without a performance management agent prints "N/A (no PMA)" in every counter
    # file (the kernel's ib sysfs; prometheus/procfs reads it the same way).
    (real_sys / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text(
        "N/A (no PMA)\n")
    mlx5 = ib_counters.parse(_read(real_sys))[-1]
    assert mlx5.counters["symbol_error"] is None
    for bad in ("mlx5_0/ports/1/counters/link_downed:-1\n", "mlx5_0/ports/1/counters/x:nan\n",
                "link_downed 3\n"):
        with pytest.raises(ParseError):
            ib_counters.parse(bad)


def _bands() -> tuple[dict, dict]:  # type: ignore[type-arg]
    profile = load_profile("h100-sxm5-80gb-8x")
    bands = {c: profile.band(f"ib_counters.{c}_per_h") for c in ib_counters.ERROR_COUNTERS}
    high = {c: profile.value(f"ib_counters.{c}_high", int) for c in ib_counters.ERROR_COUNTERS}
    return bands, high


def _port(**counts: int | None) -> ib_counters.PortCounters:
    values: dict[str, int | None] = dict.fromkeys(ib_counters.ERROR_COUNTERS, 0)
    values.update(counts)
    return ib_counters.PortCounters("mlx5_0", 1, values)


NOW = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)


def _judged(port: ib_counters.PortCounters, before: dict[str, float] | None = None,
            hours: float = 2.0) -> dict[str, tuple[Status, str, str]]:
    then = (NOW - timedelta(hours=hours)).isoformat(timespec="seconds")
    previous = {(CHECK, f"mlx5_0/1/{c}"): (v, then) for c, v in (before or {}).items()}
    bands, high = _bands()
    return {v.metric.rsplit("/", 1)[1]: (v.status, v.code, v.detail)
            for v in judge_ib_counters((port,), previous, bands, high, NOW)}


def test_a_growing_link_downed_counter_fails_the_port() -> None:
    rows = _judged(_port(link_downed=5), {"link_downed": 2})
    status, code, detail = rows["link_downed"]
    assert (status, code) == (Status.FAIL, "fabric.ib.link_downed_growing")
    assert detail.startswith("grew by 3 to 5 in 2.00 h since the previous run: 1.5/h")
    assert rows["symbol_error"][:2] == (Status.PASS, "ok")


def test_slow_growth_warns_and_fast_growth_fails() -> None:
    rows = _judged(_port(symbol_error=110, port_rcv_errors=30), {"symbol_error": 100,
                                                                  "port_rcv_errors": 0})
    assert rows["symbol_error"][:2] == (Status.WARN, "fabric.ib.symbol_error_growing")  # 5/h
    assert rows["port_rcv_errors"][:2] == (Status.FAIL, "fabric.ib.port_rcv_errors_growing")


def test_a_high_constant_counter_warns_and_a_low_one_passes() -> None:
    rows = _judged(_port(link_downed=12, symbol_error=7), {"link_downed": 12,
                                                            "symbol_error": 7})
    assert rows["link_downed"][:2] == (Status.WARN, "fabric.ib.counter_high")
    assert "no growth since the previous run" in rows["link_downed"][2]
    assert rows["symbol_error"][:2] == (Status.PASS, "ok")


def test_a_saturated_counter_warns_whatever_its_high_count() -> None:
    bands, high = _bands()
    high["link_downed"] = 10**6
    port = _port(link_downed=255)
    (row,) = [v for v in judge_ib_counters((port,), {}, bands, high, NOW)
              if v.metric.endswith("/link_downed")]
    assert (row.status, row.code) == (Status.WARN, "fabric.ib.counter_high")
    assert "saturated" in row.detail


def test_first_reading_and_restarted_counters_have_no_rate() -> None:
    first = _judged(_port(link_downed=3))
    assert first["link_downed"][:2] == (Status.PASS, "ok")
    assert "first reading" in first["link_downed"][2]
    restarted = _judged(_port(link_downed=0), {"link_downed": 40})
    assert restarted["link_downed"][:2] == (Status.PASS, "ok")
    assert "counters restarted" in restarted["link_downed"][2]
    assert _judged(_port(link_downed=None))["link_downed"][0] is Status.SKIP
    missing = ib_counters.PortCounters("mlx5_0", 1, {"link_downed": 0})
    bands, high = _bands()
    codes = {v.code for v in judge_ib_counters((missing,), {}, bands, high, NOW)}
    assert codes == {"ok", "fabric.ib.counter_missing"}
    assert set(GROWING) == set(ib_counters.ERROR_COUNTERS)


def _write_run(root: Path, run_id: str, time: str, value: float, node: str = "gpu-01") -> None:
    row = CheckResult(run_id, time, node, "pool", "prof", CHECK, "mlx5_0/1/link_downed", value,
                      "count", None, None, Status.PASS, "ok", "", 0.1)
    other = CheckResult(run_id, time, node, "pool", "prof", "gpu.count", "gpu_count", 8.0,
                        "", None, None, Status.PASS, "ok", "", 0.1)
    (root / run_id).mkdir(parents=True)
    pq.write_table(results_table(to_frame([row, other])), root / run_id / "results.parquet")


def test_history_gives_each_node_its_latest_earlier_value(tmp_path: Path) -> None:
    assert last_values(tmp_path / "none-yet", [CHECK]) == {}
    _write_run(tmp_path, "20261206T010000Z-aaaa", "2026-12-06T01:00:00+00:00", 1.0)
    _write_run(tmp_path, "20261206T020000Z-bbbb", "2026-12-06T02:00:00+00:00", 4.0)
    _write_run(tmp_path, "20261206T020500Z-cccc", "2026-12-06T02:05:00+00:00", 9.0, "gpu-02")
    got = last_values(tmp_path, [CHECK], {"gpu-01"})
    assert got == {"gpu-01": {(CHECK, "mlx5_0/1/link_downed"): (4.0, "2026-12-06T02:00:00+00:00")}}
    # A later row without a value (the counter could not be read) leaves the last reading as
    # the baseline; otherwise a counter that grew meanwhile would read as restarted and pass.
    _write_run(tmp_path, "20261206T030000Z-dddd", "2026-12-06T03:00:00+00:00", float("nan"))
    assert last_values(tmp_path, [CHECK], {"gpu-01"}) == got


# ---------------------------------------------------------------------------- the lab


def test_lab_counters_have_the_real_layout_and_flap_grows_them(tmp_path: Path,
                                                               real_sys: Path) -> None:
    hw = tmp_path / "hw"
    write_hardware(hw, render_host("h100-sxm5-8x", "node1"))
    root = write_ib_counters(hw)
    nics = [n["name"] for n in json.loads((hw / "hardware.json").read_text())["nics"]]
    real = {p.relative_to(real_sys / "class/infiniband/mlx5_0")
            for p in (real_sys / "class/infiniband/mlx5_0/ports/1/counters").iterdir()}
    ours = {p.relative_to(root / nics[0]) for p in (root / nics[0] / "ports/1/counters").iterdir()}
    assert ours <= real  # the files a real mlx5 port has, by the same names
    assert (root / nics[0] / "ports/1/counters/link_downed").read_text() == "0\n"
    sysfs = hw / "sys"
    healthy = ib_counters.parse(_read(sysfs))
    assert [p.name for p in healthy] == [f"{n}/1" for n in sorted(nics)]
    write_ib_counters(hw, ["ib-link-flap"], [])
    write_ib_counters(hw, ["ib-link-flap"], ["ib-link-flap"])  # still on: no new flap
    flapped = {p.name: p.counters for p in ib_counters.parse(_read(sysfs))}
    assert flapped[f"{nics[0]}/1"]["link_downed"] == 3
    assert flapped[f"{nics[0]}/1"]["link_error_recovery"] == 1
    assert all(c["link_downed"] == 0 for n, c in flapped.items() if n != f"{nics[0]}/1")
