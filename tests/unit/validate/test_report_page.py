"""run.json and the report page without a browser: the record round-trips, a re-render by
``python -m validate report`` equals the original byte for byte, the page is self-contained
and carries every row; bad run.json is named field by field.

The run is tests/unit/validate/real_fleet.py: real captures judged by the checks, one node really
unreachable. The browser test (test_report_browser.py) drives the same page in Chromium."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.unit.validate import real_fleet
from validate import cli, runinfo
from validate.model import EXIT_MEANING, CheckResult, ExitCode, Status
from validate.report import write_report
from validate.runinfo import RunInfo, RunInfoError

FILES = ("results.parquet", "results.csv", "nodes.csv", "fleet.csv", "summary.md",
         "index.html", "junit.xml", "metrics.prom", "run.json")


@pytest.fixture(scope="module")
def fleet_run(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, list[CheckResult], RunInfo]:
    root = tmp_path_factory.mktemp("fleet")
    inventory = real_fleet.write_inventory(root / "inventory")
    nodes = real_fleet.fleet_nodes(inventory)
    rows = real_fleet.fleet_rows(fixtures_dir, nodes)
    info = runinfo.start(run_id=real_fleet.RUN_ID, environment=real_fleet.ENVIRONMENT,
                         inventory=inventory, limit=None, checks_requested="gpu.*,fabric.*",
                         checks=sorted(set(real_fleet.H100_CHECKS) | set(real_fleet.A100_CHECKS)),
                         nodes=nodes)
    info = dataclasses.replace(info, finished=runinfo.now_utc())
    report = write_report(rows, root / "reports", real_fleet.RUN_ID, run_info=info)
    return report.run_dir, rows, info


def _data(page: str) -> dict:  # type: ignore[type-arg]
    m = re.search(r'<script type="application/json" id="gpuready-data">(.*?)</script>', page,
                  re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def test_run_json_records_what_the_run_used(fleet_run: tuple[Path, list[CheckResult], RunInfo]
                                            ) -> None:
    run_dir, _, _ = fleet_run
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["schema"] == 1 and doc["run_id"] == real_fleet.RUN_ID
    assert doc["environment"] == real_fleet.ENVIRONMENT
    assert doc["exit_code"] == ExitCode.UNREACHABLE and doc["finished"] >= doc["started"]
    assert doc["checks_requested"] == "gpu.*,fabric.*" and "nccl.allreduce" in doc["checks"]
    assert doc["suite_version"] == "0.1.0"
    assert doc["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", doc["git_commit"])
    by_name = {p["name"]: p for p in doc["profiles"]}
    h100 = by_name["h100-sxm5-80gb-8x"]
    assert h100["pools"] == ["pool_h100_sxm"] and len(h100["nodes"]) == 6
    # thresholds as judged: the NHC floor from the profile, fio floors from the inventory's
    # drive class (virtual), not the profile's nvme-gen4
    assert h100["thresholds"]["nccl"]["allreduce_busbw_gbps"] == {
        "warn": 470, "fail": 460, "better": "higher"}
    assert h100["storage"]["drive_class"] == "virtual"
    assert h100["thresholds"]["fio"]["seq_read_mibps"]["fail"] == 20
    assert by_name["a100-sxm4-80gb-8x"]["hardware"]["nvlinks_per_gpu"] == 12


def test_rerender_equals_the_original_byte_for_byte(
        fleet_run: tuple[Path, list[CheckResult], RunInfo], tmp_path: Path) -> None:
    run_dir, _, _ = fleet_run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    for name in FILES:
        if name not in ("results.parquet", "results.csv", "run.json"):
            (copy / name).unlink()  # only the results and run.json are read back
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["report", str(copy)], out, err) == ExitCode.UNREACHABLE, err.getvalue()
    assert err.getvalue() == ""
    differ = [n for n in FILES if (copy / n).read_bytes() != (run_dir / n).read_bytes()]
    assert differ == []
    assert f"**Environment: {real_fleet.ENVIRONMENT}**" in (copy / "summary.md").read_text()


def test_rerender_without_run_json_says_what_it_lacks(
        fleet_run: tuple[Path, list[CheckResult], RunInfo], tmp_path: Path) -> None:
    run_dir, _, _ = fleet_run
    copy = tmp_path / "old-run"
    shutil.copytree(run_dir, copy)
    (copy / "run.json").unlink()
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["report", str(copy)], out, err) == ExitCode.UNREACHABLE
    assert "has no run.json" in err.getvalue()
    assert not (copy / "run.json").exists()
    assert "No run.json" in (copy / "index.html").read_text()


def test_bad_run_json_is_named(fleet_run: tuple[Path, list[CheckResult], RunInfo],
                               tmp_path: Path) -> None:
    run_dir, _, _ = fleet_run
    copy = tmp_path / "bad"
    shutil.copytree(run_dir, copy)
    doc = json.loads((copy / "run.json").read_text())
    doc["profiles"][0]["thresholds"] = "fast"
    (copy / "run.json").write_text(json.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["report", str(copy)], out, err) == ExitCode.USAGE_OR_TOOL_ERROR
    assert "profiles[0]: field 'thresholds': expected dict, got 'fast'" in err.getvalue()
    with pytest.raises(RunInfoError, match="field 'run_id' is missing"):
        runinfo.from_json(json.dumps({k: v for k, v in doc.items() if k != "run_id"}))
    with pytest.raises(RunInfoError, match="not JSON"):
        runinfo.from_json("{")
    with pytest.raises(RunInfoError, match="field 'run_kind': expected one of validation, "
                                           "drift, acceptance, got 'nightly'"):
        runinfo.from_json(json.dumps({**doc, "run_kind": "nightly"}))


def test_run_kind_is_recorded_and_an_older_run_json_is_a_validation_run(
        fleet_run: tuple[Path, list[CheckResult], RunInfo], tmp_path: Path) -> None:
    run_dir, _, _ = fleet_run
    doc = json.loads((run_dir / "run.json").read_text())
    assert doc["run_kind"] == "validation" and runinfo.run_kind(run_dir) == "validation"
    del doc["run_kind"]  # written before the field
    assert runinfo.from_json(json.dumps(doc)).run_kind == "validation"
    # Without run.json, the layout says: drift.json beside the results is a drift run.
    bare = tmp_path / "bare"
    bare.mkdir()
    assert runinfo.run_kind(bare) == "validation"
    (bare / "drift.json").write_text("{}")
    assert runinfo.run_kind(bare) == "drift"
    (bare / "run.json").write_text(json.dumps({"run_kind": "validation"}))
    assert runinfo.run_kind(bare) == "validation"  # the field wins over the layout


def test_run_info_round_trips(fleet_run: tuple[Path, list[CheckResult], RunInfo]) -> None:
    _, _, info = fleet_run
    text = info.to_json()
    assert runinfo.from_json(text) == info and runinfo.from_json(text).to_json() == text


def test_page_is_self_contained_and_carries_every_row(
        fleet_run: tuple[Path, list[CheckResult], RunInfo]) -> None:
    run_dir, rows, _ = fleet_run
    page = (run_dir / "index.html").read_text()
    assert "default-src 'none'" in page  # the browser refuses any fetch from this page
    markup = re.sub(r"<script\b.*?</script>", "", page, flags=re.S)
    # links go to the page itself or to documentation; every image is inline
    assert not re.search(r'href="(?!#|https://)', markup)
    assert re.findall(r'src="([a-z]+):', markup) == ["data"] * markup.count('src="')
    assert not re.search(r"<(link|iframe|object|embed)\b|@import|url\(", page)
    data = _data(page)
    assert len(data["rows"]["value"]) == len(data["rows"]["status"]) == len(rows)
    assert data["nodes"]["name"] == sorted({r.node for r in rows})
    n = data["nodes"]["name"].index("gpu-h100-05")
    start, end = data["nodes"]["start"][n], data["nodes"]["start"][n + 1]
    codes = {data["codes"][c] for c in data["rows"]["code"][start:end]}
    assert {"gpu.ecc.remap_pending", "gpu.xid.63"} <= codes
    assert "row remapping" in data["actions"]["gpu.xid.63"]["meaning"]
    assert data["actions"]["gpu.ecc.remap_pending"]["url"].startswith("https://docs.nvidia.com/")
    # header: environment, exit code and its meaning, counts per status
    assert f"Environment: {real_fleet.ENVIRONMENT}" in page
    assert "Exit code <strong>3</strong> (UNREACHABLE): unreachable hosts." in page
    assert set(EXIT_MEANING) == set(ExitCode)  # every code has its sentence
    assert ">error 2</span>" in page and ">fail 3</span>" in page


def test_hostile_strings_stay_text(tmp_path: Path) -> None:
    """A detail that looks like markup cannot close the data script or inject elements."""
    evil = '</script><script>alert(1)</script><img src=x onerror=alert(2)> & "q"'
    rows = [CheckResult("r1", "2026-12-02T12:00:00+00:00", "n<1>", "pool_x", "p", "gpu.count",
                        "gpu_count", 4.0, "", None, 8.0, Status.FAIL, "gpu.count.missing", evil,
                        0.1)]
    report = write_report(rows, tmp_path, "r1", environment="<b>lab</b>")
    page = (report.run_dir / "index.html").read_text()
    assert page.count("<script") == 2 and "<img src=x" not in page
    assert "&lt;b&gt;lab&lt;/b&gt;" in page
    data = _data(page)
    assert data["details"] == [evil] and data["nodes"]["name"] == ["n<1>"]
