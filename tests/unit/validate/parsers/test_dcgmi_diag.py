"""dcgmi diag parsers (JSON and text) against every real capture in fixtures/dcgmi."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from validate.parsers import ParseError, dcgmi_diag
from validate.parsers.dcgmi_diag import DiagEntry


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "dcgmi" / name).read_text()


def test_every_diag_capture_parses(fixtures_dir: Path) -> None:
    captures = sorted((fixtures_dir / "dcgmi").glob("diag*"))
    assert len(captures) >= 4
    for path in captures:
        report = dcgmi_diag.parse(path.read_text())
        assert report.entries, path.name


def test_json_dcgm31_all_pass_with_nulls_and_a_line_before(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt")
    assert text.lstrip().startswith("WARNING")  # the line the parser must step over
    report = dcgmi_diag.parse(text)
    assert (report.version, report.gpu_count) == ("3.1.0", 8)
    deployment = [e for e in report.entries if e.category == "Deployment"]
    assert [e.test for e in deployment] == [
        "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks",
        "Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap",
        "Graphics Processes", "Inforom",
    ]  # fmt: skip
    assert {e.gpu for e in deployment} == {None}  # "0,1,...,7": about all GPUs at once
    custom = [e for e in report.entries if e.category == "Custom"]
    assert [e.gpu for e in custom] == list(range(8))
    assert {e.status for e in report.entries} == {"pass"}
    assert dcgmi_diag.failures(report) == []


def test_text_p4de_r2_all_pass(fixtures_dir: Path) -> None:
    report = dcgmi_diag.parse(_read(fixtures_dir, "diag-r2-p4de-8x-a100-80gb-dcgm3.3.3-pass.txt"))
    assert (report.version, report.driver, report.gpu_count) == ("3.3.3", "535.104.12", 8)
    assert [(e.category, e.test) for e in report.entries][-3:] == [
        ("Deployment", "Inforom"), ("Integration", "PCIe"), ("Hardware", "GPU Memory")]
    assert len(report.entries) == 11
    assert {e.status for e in report.entries} == {"pass"}
    assert dcgmi_diag.failures(report) == []


def test_text_deployment_error_row_remap_pending(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "diag-deployment-error-row-remap-pending-gpu3-excerpt.txt")
    report = dcgmi_diag.parse(text)
    [(entry, code)] = dcgmi_diag.failures(report)
    assert code == "dcgm.diag.row_remap_pending"
    assert entry == DiagEntry(
        "Deployment", "Error", 3, "fail",
        ("GPU 3 has uncorrectable memory errors and row remappings are pending",))


def test_text_memory_fail_gpu0_with_wrapped_warning(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "diag-r2-gpu-memory-fail-gpu0-thermal-warning-excerpt.txt")
    report = dcgmi_diag.parse(text)
    memory = [e for e in report.entries if e.test == "GPU Memory"]
    assert sorted((e.gpu, e.status) for e in memory) == [
        (0, "fail"), *((g, "pass") for g in range(1, 8))]
    [(entry, code)] = dcgmi_diag.failures(report)
    assert entry.gpu == 0
    # The message DCGM cut mid-word ("second" / "s", "GP" / "U 0") is whole again.
    assert entry.messages == (
        "GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test "
        "for GPU 0 Verify that the cooling on this machine is functional, including external, "
        "thermal material interface, fans, and any other components.",)
    assert code == "dcgm.diag.thermal_power"  # the cause DCGM names, not the test that saw it


def _doc(results: list[object], name: str = "memory", category: str = "Hardware",
         key: str = "DCGM Diagnostic") -> str:
    return json.dumps({key: {"test_categories": [
        {"category": category, "tests": [{"name": name, "results": results}]}]},
        "metadata": {"version": "4.2.3"}})


def test_json_dcgm4_entity_ids_and_error_ids() -> None:
    # The DCGM 4 document shape (DCGM's nvvs/include/NvvsCommon.h): entity_id per result,
    # warnings as objects with DCGM's error id (dcgm_errors.h: 85 = row remap pending).
    text = _doc([
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
         "warnings": [{"warning": "GPU 1 needs a reset", "error_id": 85,
                       "error_category": 4, "error_severity": 2}]},
    ])
    report = dcgmi_diag.parse(text)
    assert report.version == "4.2.3"
    [(entry, code)] = dcgmi_diag.failures(report)
    assert (entry.gpu, entry.messages, entry.error_ids) == (1, ("GPU 1 needs a reset",), (85,))
    assert code == "dcgm.diag.row_remap_pending"  # the error id wins over the test name


def _gpu(entity: int, status: str, **extra: object) -> dict[str, object]:
    return {"entity_group": "GPU", "entity_group_id": 1, "entity_id": entity, "status": status,
            **extra}


def test_json_dcgm4_as_nvidias_schema_has_it(fixtures_dir: Path) -> None:
    """No licensed real DCGM 4 capture exists here: the documents are held to NVIDIA's JSON
    Schema of DCGM 4's output (the one NVIDIA's tests validate real output against) before the
    parser reads them. A summary failure no result shows (an error about no entity) is one
    failure of all GPUs; a CPU's result is about no GPU; entity_groups counts the GPUs."""
    import jsonschema  # noqa: PLC0415  (a test dependency: ansible-lint's)

    schema = jsonschema.Draft7Validator(json.loads(
        (fixtures_dir / "dcgmi" / "schema-diag-json-dcgm4.6.0.json").read_text()))
    warning = {"warning": "NVLink bandwidth below the threshold for the node", "error_id": 99,
               "error_category": 2, "error_severity": 2}
    doc = {"DCGM Diagnostic": {"test_categories": [
        {"category": "Integration", "tests": [
            {"name": "pcie", "results": [_gpu(0, "Pass"), _gpu(1, "Pass")],
             "test_summary": {"status": "Fail", "warnings": [warning]}}]},
        {"category": "Hardware", "tests": [
            {"name": "memory", "results": [
                _gpu(0, "Pass"),
                {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Pass"}],
             "test_summary": {"status": "Pass"}}]}]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": [
            {"entity_id": g, "device_id": "2330"} for g in range(4)]}],
        "metadata": {"version": "4.6.0", "Driver Version Detected": "580.82.07"}}
    schema.validate(doc)
    report = dcgmi_diag.parse(json.dumps(doc, indent="\t"))
    assert (report.version, report.driver, report.gpu_count) == ("4.6.0", "580.82.07", 4)
    [(entry, code)] = dcgmi_diag.failures(report)
    assert (entry.test, entry.gpu, entry.error_ids) == ("pcie", None, (99,))
    assert code == "dcgm.diag.nvlink"  # error id 99 (dcgm_errors.h), not the test's name
    assert [e.gpu for e in report.entries if e.test == "memory"] == [0, None]


@pytest.mark.parametrize(("test", "message", "code"), [
    ("pcie", "GPU 2 PCIe replay count violation", "dcgm.diag.pcie"),
    ("memory", "GPU 0 Memory error detected", "dcgm.diag.memory"),
    ("NVLink", "", "dcgm.diag.nvlink"),
    ("targeted_power", "", "dcgm.diag.thermal_power"),
    ("diagnostic", "", "dcgm.diag.compute"),
    ("Persistence Mode", "", "dcgm.diag.deployment"),
    ("something new", "", "dcgm.diag.other"),
])
def test_codes(test: str, message: str, code: str) -> None:
    category = "Deployment" if test == "Persistence Mode" else "Hardware"
    entry = DiagEntry(category, test, 0, "fail", (message,) if message else ())
    assert dcgmi_diag.code_for(entry) == code


def test_runtime_error_is_kept() -> None:
    report = dcgmi_diag.parse_json(json.dumps(
        {"DCGM GPU Diagnostic": {"version": "3.3.3", "runtime_error": "nv-hostengine gone"}}))
    assert (report.runtime_error, report.entries) == ("nv-hostengine gone", ())


@pytest.mark.parametrize(("text", "reason"), [
    ("", "no diagnostic table"),
    ("Error: unable to establish a connection to the specified host: localhost\n",
     "no diagnostic table"),
    ("{\n  \"DCGM GPU Diagnostic\": {\n", "invalid JSON"),
    ('{"other": {}}', "no \"DCGM GPU Diagnostic\""),
    (_doc([{"entity_id": 0, "status": "Maybe"}]), "unknown status 'Maybe'"),
    (_doc([{"entity_id": "N", "status": "Pass"}]).replace('"N"', "NaN"),
     "NaN is not a number"),
    ("| GPU Memory                | Perhaps                                        |\n",
     "unknown result 'Perhaps'"),
])
def test_garbage_is_a_parse_error(text: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        dcgmi_diag.parse(text)
