"""lab/sim/dcgmi.py held to the real dcgmi captures, with the simulated host engine
(lab/sim/daemons.py nv-hostengine) it needs, and the lab faults failing the way real output
fails. The validators' parser reads every output the simulator prints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.hardware import render_host, write_faults, write_hardware
from lab.sim import dcgmi
from validate.parsers import dcgmi_diag

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    write_hardware(tmp_path / "hw", render_host("h100-sxm5-8x", "gpu-h100-01"))
    write_faults(tmp_path / "hw", [])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "nvidia-module-version").write_text("550.90.07\n")
    return tmp_path


def _env(node: Path, tool: str, version: str = "3.3.6") -> dict[str, str]:
    return {"GPUREADY_LAB_HW": str(node / "hw"), "GPUREADY_LAB_RUN": str(node / "run"),
            "GPUREADY_SIM_TOOL": tool, "GPUREADY_SIM_VERSION": version, "PATH": "/usr/bin:/bin"}


@pytest.fixture
def engine(node: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, str(SIM / "daemons.py"), "-n", "--service-account",
                             "nvidia-dcgm"], env=_env(node, "nv-hostengine"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_file = node / "run" / "nv-hostengine.pid"
    for _ in range(100):
        if pid_file.exists():
            break
        proc.poll()
        assert proc.returncode is None, proc.communicate()
        subprocess.run(["sleep", "0.05"], check=True)
    assert pid_file.read_text().strip() == str(proc.pid)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=5)
    assert proc.returncode == 0 and not pid_file.exists()


def _dcgmi(node: Path, *args: str, version: str = "3.3.6") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SIM / "dcgmi.py"), *args],
                          env=_env(node, "dcgmi", version), capture_output=True, text=True,
                          timeout=30, check=False)


def test_text_table_is_the_real_a100_capture_byte_for_byte(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "dcgmi/diag-r2-p4de-8x-a100-80gb-dcgm3.3.3-pass.txt").read_text()
    a100 = render_host("a100-sxm4-8x", "h")
    ids = [g["pci_device_id"][2:6].lower() for g in a100["gpus"]]
    assert dcgmi.render_text("3.3.3", "535.104.12", ids, 2, []) == real


def test_json_is_the_real_dcgm31_capture_byte_for_byte(fixtures_dir: Path) -> None:
    lines = (fixtures_dir / "dcgmi/diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt"
             ).read_text().splitlines(keepends=True)
    # The capture sits in a C++ string: a WARNING line before it and its first brace indented.
    assert lines[0].strip().startswith("WARNING") and lines[1] == "\t{\n"
    real = "{\n" + "".join(lines[2:])
    assert dcgmi.render_json("3.1.0", 8, 1, []) == real


def test_a_deployment_error_prints_as_the_real_excerpt(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "dcgmi/diag-deployment-error-row-remap-pending-gpu3-excerpt.txt"
            ).read_text()
    remap = dcgmi.Finding("Page Retirement/Row Remap", 3, dcgmi.ROW_REMAP)
    out = dcgmi.render_text("3.3.6", "550.90.07", ["2330"] * 8, 1, [remap])
    assert out.startswith(real)  # the excerpt, then the table's closing border
    assert out[len(real):] == dcgmi.BORDER + "\n"


def test_a_warning_is_cut_as_dcgm_cuts_it(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "dcgmi/diag-r2-gpu-memory-fail-gpu0-thermal-warning-excerpt.txt"
            ).read_text().splitlines()
    [(entry, _)] = dcgmi_diag.failures(dcgmi_diag.parse("\n".join(real) + "\n"))
    message = entry.messages[0]
    rows = dcgmi._message_rows("Warning", message)
    assert rows[:-1] == real[2:-1]  # every full piece; the capture's last cell is not closed
    assert rows[-1].startswith(real[-1])


def test_healthy_node_passes_every_level(node: Path, engine: subprocess.Popen[str]) -> None:
    for level in ("1", "2", "3"):
        for fmt in ((), ("-j",)):
            proc = _dcgmi(node, "diag", "-r", level, *fmt)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            report = dcgmi_diag.parse(proc.stdout)
            assert dcgmi_diag.failures(report) == []
            assert report.version == "3.3.6"
    text = dcgmi_diag.parse(_dcgmi(node, "diag", "-r", "1").stdout)
    assert (text.driver, text.gpu_count) == ("550.90.07", 8)


@pytest.mark.parametrize(("fault", "level", "code", "gpu"), [
    ("row-remap-pending", "1", "dcgm.diag.row_remap_pending", 1),
    ("pcie-degraded", "2", "dcgm.diag.pcie", 2),
    ("gpu-memory-fail", "2", "dcgm.diag.memory", 0),
])
def test_faults_fail_with_code_and_gpu(node: Path, engine: subprocess.Popen[str], fault: str,
                                       level: str, code: str, gpu: int) -> None:
    write_faults(node / "hw", [fault])
    for fmt in ((), ("-j",)):
        proc = _dcgmi(node, "diag", "-r", level, *fmt)
        assert proc.returncode == dcgmi.RC_NVVS_ERROR, proc.stdout
        [(entry, found)] = dcgmi_diag.failures(dcgmi_diag.parse(proc.stdout))
        assert (found, entry.gpu) == (code, gpu), (fmt, entry)
        assert f"GPU {gpu}" in entry.messages[0]
    if level == "2":  # nvidia-smi's view is unchanged at level 1: DCGM's load tests see it
        assert _dcgmi(node, "diag", "-r", "1", "-j").returncode == 0


def test_no_host_engine_is_dcgms_connection_error(node: Path) -> None:
    proc = _dcgmi(node, "diag", "-r", "1", "-j")
    assert proc.returncode == dcgmi.RC_CONNECTION
    assert proc.stdout == dcgmi.CONNECTION_ERROR


def test_host_engine_does_not_start_without_a_driver(node: Path) -> None:
    write_faults(node / "hw", ["driver-not-loaded"])
    proc = subprocess.run([sys.executable, str(SIM / "daemons.py"), "-n"],
                          env=_env(node, "nv-hostengine"), capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == 1 and "driver is not loaded" in proc.stderr


# -- DCGM 4 ----------------------------------------------------------------------------------
# No licensed real `dcgmi diag -j` capture of DCGM 4 was found (issue 41); DCGM 4's output is
# held to NVIDIA's JSON Schema of it, the one NVIDIA's own tests validate real output against.
SCHEMA = "dcgmi/schema-diag-json-dcgm4.6.0.json"


def _schema(fixtures_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((fixtures_dir / SCHEMA).read_text())
    return doc


@pytest.mark.parametrize(("fault", "level", "code", "gpu"), [
    (None, "1", None, None), (None, "2", None, None), (None, "3", None, None),
    ("row-remap-pending", "1", "dcgm.diag.row_remap_pending", 1),
    ("pcie-degraded", "2", "dcgm.diag.pcie", 2),
    ("gpu-memory-fail", "3", "dcgm.diag.memory", 0),
])
def test_dcgm4_json_is_valid_by_nvidias_schema_and_parses(
        fixtures_dir: Path, node: Path, engine: subprocess.Popen[str], fault: str | None,
        level: str, code: str | None, gpu: int | None) -> None:
    import jsonschema  # noqa: PLC0415  (a test dependency: ansible-lint's)

    write_faults(node / "hw", [fault] if fault else [])
    proc = _dcgmi(node, "diag", "-r", level, "-j", version="4.6.0")
    assert proc.returncode == (dcgmi.RC_NVVS_ERROR if fault else 0), proc.stdout
    doc = json.loads(proc.stdout)
    schema = jsonschema.Draft7Validator(_schema(fixtures_dir))
    schema.validate(doc)
    # The schema tells the layouts apart: DCGM 3's document, which the DCGM 4 simulator
    # printed before issue 41, is not DCGM 4's.
    assert not schema.is_valid(json.loads(dcgmi.render_json("4.6.0", 8, int(level), [])))
    # What DCGM 4.6.0's dcgmi/Diag.cpp writes beyond what the schema requires.
    assert list(doc) == ["DCGM Diagnostic", "entity_groups", "metadata"]
    assert doc["metadata"] == {"Driver Version Detected": "550.90.07", "version": "4.6.0"}
    categories = [c["category"] for c in doc["DCGM Diagnostic"]["test_categories"]]
    assert categories == ["Deployment", "Integration", "Hardware", "Stress"][:{
        "1": 1, "2": 3, "3": 4}[level]]
    tests = [t["name"] for c in doc["DCGM Diagnostic"]["test_categories"] for t in c["tests"]]
    assert tests == ["software", "pcie", "memory", "diagnostic", "targeted_stress",
                     "targeted_power", "memory_bandwidth"][:{"1": 1, "2": 3, "3": 7}[level]]
    (group,) = doc["entity_groups"]
    assert [e["entity_id"] for e in group["entities"]] == list(range(8))
    report = dcgmi_diag.parse(proc.stdout)
    assert (report.version, report.driver, report.gpu_count) == ("4.6.0", "550.90.07", 8)
    if fault is None:
        assert dcgmi_diag.failures(report) == []
        return
    [(entry, found)] = dcgmi_diag.failures(report)
    assert (found, entry.gpu) == (code, gpu)
    assert f"GPU {gpu}" in entry.messages[0]


def test_dcgm4_json_is_written_as_jsoncpp_styles_it(node: Path,
                                                    engine: subprocess.Popen[str]) -> None:
    """Tab-indented, ``"key" : value``, keys in byte order (jsoncpp's toStyledString, as the
    DCGM 3.1 capture shows it), the result's keys as Diag.cpp names them."""
    out = _dcgmi(node, "diag", "-r", "1", "-j", version="4.6.0").stdout
    lines = out.splitlines()
    assert lines[:6] == ["{", '\t"DCGM Diagnostic" :', "\t{", '\t\t"test_categories" :',
                         "\t\t[", "\t\t\t{"]
    first = out.index('"entity_group" : "GPU"')
    assert [k.strip().split(" :")[0] for k in out[first:].splitlines()[:4]] == [
        '"entity_group"', '"entity_group_id"', '"entity_id"', '"status"']
