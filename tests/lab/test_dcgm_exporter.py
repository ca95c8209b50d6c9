"""dcgm.exporter on the lab (issue 32): a one-host lab whose SIMULATED dcgm-exporter
(lab/sim/dcgm_exporter.py, gpuready-lab-dcgm-exporter.service) serves the host's own address.
With the driver installed the check passes over SSH and HTTP as a run of the validators does it;
dcgm-exporter-down fails it with dcgm.exporter.down, dcgm-exporter-stale with
dcgm.exporter.uuid_mismatch, and clearing the fault passes again without a restart."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from lab import core, exporter
from lab.core import LabState
from lab.paths import LabPaths
from lab.sim.dcgm_exporter import stale_uuid
from tests.lab.conftest import DEBIAN12_CUDA, lab_apt_sources, print_past_capture, running_lab, ssh
from validate import cli
from validate.checks.base import ToolFailure
from validate.checks.dcgm_exporter import CODE_DOWN, scrape
from validate.model import ExitCode

PROVISION = """
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq nvidia-driver-cuda=550.90.07-1 nvidia-kernel-dkms=550.90.07-1 \\
  nvidia-persistenced=550.90.07-1 >/dev/null
"""


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[LabState]:
    started = time.monotonic()
    with running_lab(nodes=1) as state:
        yield state
    print_past_capture(request, f"test_dcgm_exporter: {time.monotonic() - started:.0f} s in all")


def _url(state: LabState) -> str:
    return f"http://{state.hosts[0].address}:{exporter.PORT}/metrics"


def _run(tmp_path: Path) -> tuple[int, pd.DataFrame]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["run", "-i", str(LabPaths.default().inventory_dir), "--timeout", "10",
                   "--checks", "gpu.count,dcgm.exporter", "--out", str(tmp_path)],
                  stdout=out, stderr=err)
    assert rc in (ExitCode.OK, ExitCode.CHECK_FAILED), out.getvalue() + err.getvalue()
    report = next(line.removeprefix("report: ") for line in out.getvalue().splitlines()
                  if line.startswith("report: "))
    rows = pd.read_parquet(Path(report) / "results.parquet")
    return rc, rows[rows["check"] == "dcgm.exporter"]


def _codes(rows: pd.DataFrame) -> dict[str, tuple[str, str]]:
    return {m: (s, c) for m, s, c in zip(rows["metric"], rows["status"], rows["code"],
                                         strict=True)}


def _wait_refused(url: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            scrape(url, 2.0)
        except ToolFailure as exc:
            if exc.code == CODE_DOWN and "refused" in exc.detail:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} still answers after {within} s")


def test_the_exporter_follows_the_driver_and_the_faults(lab: LabState, tmp_path: Path) -> None:
    paths = LabPaths.default()
    host = lab.hosts[0]
    unit = ssh(host.address, f"systemctl show -p ActiveState -p Description {exporter.UNIT_NAME}")
    assert "ActiveState=active" in unit.stdout, unit.stdout + unit.stderr
    assert "SIMULATED" in unit.stdout
    # No driver yet: the real exporter cannot start DCGM; this one does not listen.
    _wait_refused(_url(lab))

    proc = ssh(host.address, lab_apt_sources(lab.repo_port, DEBIAN12_CUDA, "extras") + PROVISION,
               timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    deadline = time.monotonic() + 10
    while True:
        try:
            scrape(_url(lab), 2.0)
            break
        except ToolFailure:
            assert time.monotonic() < deadline, "the exporter did not listen after the driver"
            time.sleep(0.2)

    rc, rows = _run(tmp_path / "healthy")
    assert rc == ExitCode.OK, rows.to_string()
    assert _codes(rows) == {m: ("pass", "ok") for m in
                            ("scrape", "gpu_count", "uuids", "driver_version", "error_counters")}
    assert "driver 550.90.07" in rows[rows["metric"] == "driver_version"]["detail"].iloc[0]

    try:
        core.set_faults(paths, host.name, ["dcgm-exporter-down"], [], clear=False)
        _wait_refused(_url(lab))
        rc, rows = _run(tmp_path / "down")
        assert rc == ExitCode.CHECK_FAILED
        assert _codes(rows) == {"": ("fail", "dcgm.exporter.down")}
        assert "refused" in rows["detail"].iloc[0]

        core.set_faults(paths, host.name, ["dcgm-exporter-stale"], ["dcgm-exporter-down"],
                        clear=False)
        time.sleep(1.5)  # the simulator reads its faults every half second
        rc, rows = _run(tmp_path / "stale")
        assert rc == ExitCode.CHECK_FAILED
        codes = _codes(rows)
        assert codes["uuids"] == ("fail", "dcgm.exporter.uuid_mismatch")
        assert codes["gpu_count"] == ("pass", "ok")
        detail = rows[rows["metric"] == "uuids"]["detail"].iloc[0]
        assert f"only the exporter: {stale_uuid(host.name)}" in detail
    finally:
        core.set_faults(paths, host.name, [], [], clear=True)
    time.sleep(1.5)
    rc, rows = _run(tmp_path / "cleared")
    assert rc == ExitCode.OK, rows.to_string()
