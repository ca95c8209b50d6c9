"""The validators against the scale harness: ~50 SIMULATED SSH endpoints from one process, 2%
failing in each of its ways (refuse, stall, slow, drop) and 2% with each GPU fault; every node
is reported, with the status and code its failure or fault must give (tests/scale_expect.py).
The endpoints are real SSH servers that really misbehave (lab/scale), with host key checking
on: one endpoint's known_hosts entry is another's key, and that node is rejected."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.scale.inventory import ENVIRONMENT, read_plan
from tests.scale_expect import problems, rows_by_node
from validate import cli
from validate.model import ExitCode

ENDPOINTS = 50
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("scale")
    log = directory / "harness.log"  # a file, not a pipe nobody reads that could fill up
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lab.scale", "serve", "--endpoints", str(ENDPOINTS),
             "--failure-rate", "0.02", "--fault-rate", "0.02", "--slow-s", "1",
             "--dir", str(directory)],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready" in line, f"harness did not start: {line!r} {log.read_text()!r}"
        assert f"{ENDPOINTS} SIMULATED endpoints (4 failing)" in line
        yield directory
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_node_reported_with_its_failures_status_and_code(harness: Path,
                                                               tmp_path: Path) -> None:
    plan = read_plan(harness)
    assert {e.failure for e in plan} == {"", "refuse", "stall", "slow", "drop"}
    # Host key checking stays on: give one healthy endpoint another endpoint's key.
    victim, other = [e for e in plan if not e.failure and not e.faults][:2]
    known = harness / "known_hosts"
    lines = known.read_text().splitlines(keepends=True)
    keys = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines}
    victim_name = f"[{victim.address}]:{victim.port}"
    keys[victim_name] = keys[f"[{other.address}]:{other.port}"]
    known.write_text("".join(f"{name} {key}" for name, key in keys.items()))

    out, err = io.StringIO(), io.StringIO()
    rc = cli.main(["run", "-i", str(harness / "inventory"), "--checks", "gpu.*",
                   "--out", str(tmp_path), "--timeout", "3", "--concurrency", "64"],
                  stdout=out, stderr=err)
    assert rc == ExitCode.UNREACHABLE, err.getvalue()[-2000:]
    assert ENVIRONMENT in err.getvalue() + out.getvalue()  # the label heads the run
    by_node = rows_by_node(tmp_path / "latest" / "results.csv")
    assert {(r["status"], r["code"]) for r in by_node.pop(victim.name)} == {
        ("error", "host.hostkey_rejected")}
    served = [e for e in plan if e.name != victim.name]
    assert problems(served, by_node, checks=12) == []
    assert len(by_node) == ENDPOINTS - 1


def test_a_second_harness_on_the_same_addresses_is_one_clear_error(harness: Path,
                                                                    tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lab.scale", "serve", "--endpoints", "2", "--dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("scale harness: error: cannot listen: ")
    assert "address already in use" in proc.stderr and "GPUREADY_LAB_NET" in proc.stderr
    assert not (tmp_path / "inventory").exists()
