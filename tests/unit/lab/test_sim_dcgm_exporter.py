"""The lab's SIMULATED dcgm-exporter: held to a REAL dcgm-exporter scrape (the same families in
the same order, HELP, TYPE and label names), coherent with the lab's simulated nvidia-smi, and
as a process on a real socket: it stops listening with dcgm-exporter-down and without a driver,
and reports a replaced board with dcgm-exporter-stale."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab.hardware import FAULTS, render_host
from lab.sim import dcgm_exporter as sim
from tests.unit.lab.test_sim_nvidia_smi import Host
from validate.checks.base import ToolFailure
from validate.checks.dcgm_exporter import CODE_DOWN, CODE_UUID, judge, scrape
from validate.model import Status
from validate.parsers import dcgm_exporter, nvidia_smi_xml

REAL = "dcgm-exporter/tesla-t4-1gpu-drv460.106.00-exporter2-datadog.prom"
SIM = Path(sim.__file__)
ADDRESS = os.environ.get("GPUREADY_TEST_NET", "127.0.22") + ".133"
_LABELS = re.compile(r"^(\w+)\{(.*)\} \S+$")


def _shape(text: str) -> tuple[list[tuple[str, str, str]], set[tuple[str, ...]]]:
    """(family, HELP, TYPE) in order, and each sample's label names in order."""
    families = [(f.name, f.documentation, f.type)
                for f in text_string_to_metric_families(text)]
    labels = set()
    for line in text.splitlines():
        m = _LABELS.match(line)
        if m:
            labels.add(tuple(re.findall(r'(\w+)="', m.group(2))))
    return families, labels


@pytest.mark.parametrize("profile", ["h100-sxm5-8x", "l40s-pcie-4x", "a100-sxm4-8x"])
def test_the_page_has_the_real_scrapes_shape(fixtures_dir: Path, profile: str) -> None:
    real_families, real_labels = _shape((fixtures_dir / REAL).read_text())
    page = sim.render(render_host(profile, "n1"), set(), "550.90.07", 12.5)
    families, labels = _shape(page)
    assert families == real_families
    assert labels == real_labels
    assert page.splitlines()[0].startswith("# gpuready lab simulator: SIMULATED dcgm-exporter")
    # The value formats: a float with six decimals where the real one has it, integers else.
    assert re.search(r"^DCGM_FI_DEV_POWER_USAGE\{.*\} \d+\.\d{6}$", page, re.M)
    assert re.search(r"^DCGM_FI_DEV_SM_CLOCK\{.*\} \d+$", page, re.M)


def _smi_log(host: Host) -> object:
    proc = host.smi("-q", "-x")
    assert proc.returncode == 0, proc.stderr
    return nvidia_smi_xml.parse(proc.stdout)


@pytest.mark.parametrize(("faults", "rows"), [
    ((), {"gpu_count": Status.PASS, "uuids": Status.PASS, "driver_version": Status.PASS,
          "error_counters": Status.PASS}),
    (("gpu-missing",), {"gpu_count": Status.PASS, "uuids": Status.PASS}),
    (("dcgm-exporter-stale",), {"gpu_count": Status.PASS, "uuids": Status.FAIL}),
    (("xid-79",), {"gpu7/xid": Status.WARN, "uuids": Status.PASS}),
])
def test_the_page_agrees_with_the_simulated_nvidia_smi(tmp_path: Path, faults: tuple[str, ...],
                                                       rows: dict[str, Status]) -> None:
    host = Host(tmp_path, "h100-sxm5-8x").faults(*faults)
    log = _smi_log(host)
    hw = render_host("h100-sxm5-8x", "test-h100-sxm5-8x")
    page = sim.render(hw, set(faults), host.version)
    got = {r.metric: r for r in judge(dcgm_exporter.parse(page), "u", len(log.gpus),
                                      [g.uuid for g in log.gpus if g.uuid], log.driver_version)}
    assert {m: got[m].status for m in rows} == rows
    if "dcgm-exporter-stale" in faults:
        assert got["uuids"].code == CODE_UUID
        assert sim.stale_uuid("test-h100-sxm5-8x") in got["uuids"].detail
        assert hw["gpus"][-1]["uuid"] in got["uuids"].detail


def test_the_lab_catalogue_names_both_faults() -> None:
    assert "refused" in FAULTS["dcgm-exporter-down"]
    assert "UUID" in FAULTS["dcgm-exporter-stale"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Host, str, subprocess.Popen[str]]]:
    host = Host(tmp_path, "l40s-pcie-4x")
    host.run_dir.mkdir(parents=True, exist_ok=True)
    (host.run_dir / "nvidia-module-version").write_text("550.90.07\n")
    s = socket.socket()
    s.bind((ADDRESS, 0))
    port = s.getsockname()[1]
    s.close()
    env = {"GPUREADY_LAB_HW": str(host.hw), "GPUREADY_LAB_RUN": str(host.run_dir),
           "GPUREADY_SIM_LISTEN": f"{ADDRESS}:{port}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, str(SIM)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield host, f"http://{ADDRESS}:{port}/metrics", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _until(url: str, up: bool, within: float = 5.0) -> float:
    """Seconds until a scrape of ``url`` succeeds (up) or its connection is refused (not up)."""
    started = time.monotonic()
    while time.monotonic() - started < within:
        try:
            scrape(url, 1.0)
            if up:
                return time.monotonic() - started
        except ToolFailure as exc:
            assert exc.code == CODE_DOWN
            # Not listening is a refused connection (one in the backlog as the socket closes
            # is reset instead: look again).
            if not up and "refused" in exc.detail:
                return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{url} not {'up' if up else 'down'} within {within} s")


def test_the_process_serves_stops_and_comes_back(served) -> None:
    host, url, proc = served
    _until(url, up=True)
    metrics = dcgm_exporter.parse(scrape(url, 2.0))
    assert len(metrics.gpus) == 4
    assert metrics.driver_versions == {"550.90.07"}
    host.faults("dcgm-exporter-down")
    assert _until(url, up=False) < 2.0
    host.faults()
    _until(url, up=True)
    (host.run_dir / "nvidia-module-version").unlink()  # the driver is unloaded
    _until(url, up=False)
    assert proc.poll() is None  # it waits for the driver, as a restarting unit would
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "SIMULATED dcgm-exporter" in out and "stopped listening" in out
