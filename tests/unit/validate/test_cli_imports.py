"""The command line imports what its subcommand needs (issue 39): help, the check list, a parse,
and the roll's per-node steps (``upgrade mark``, run several times per node) load no pandas,
pyarrow or matplotlib, and help loads none of Ansible, paramiko or the Kubernetes client either.

Each case runs ``python -m validate`` in a fresh interpreter (what a user and a playbook start)
with ``-X importtime``, and reads the modules it imported from that trace, so a module that is
imported and thrown away still shows. The commands that need the heavy modules (``run``,
``report``, ``gate`` reading a run, ``drift``, ``history``) are the counter-check: the same
reading must find pandas there, or the trace proves nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab.paths import REPO_ROOT
from tests.conftest import closed_port
from tests.unit.validate.gate_runs import write_inventory

FIXTURES = REPO_ROOT / "tests" / "fixtures"
DATA = ("pandas", "pyarrow", "matplotlib", "numpy")
SUITE = (*DATA, "ansible", "paramiko", "kubernetes")


def imported(*argv: str) -> tuple[int, set[str]]:
    """The exit code of ``python -X importtime -m validate ARGV`` and the top-level packages
    it imported (from the import-time trace on stderr)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "validate", *argv],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    names = {line.rsplit("|", 1)[1].strip().split(".")[0]
             for line in proc.stderr.splitlines() if line.startswith("import time:")}
    names.discard("imported package")  # the trace's header line
    return proc.returncode, names


@pytest.mark.parametrize("argv", [
    ("--help",),
    ("run", "--help"),
    ("fabric", "--help"),
    ("report", "--help"),
    ("gate", "--help"),
    ("drift", "--help"),
    ("history", "--help"),
    ("cluster", "render", "--help"),
    ("cluster", "apply", "--help"),
    ("upgrade", "plan", "--help"),
    ("upgrade", "mark", "--help"),
])
def test_help_loads_none_of_the_suite(argv: tuple[str, ...]) -> None:
    rc, names = imported(*argv)
    assert rc == 0
    assert not names & set(SUITE), sorted(names & set(SUITE))


def test_parse_and_checks_load_no_data_libraries() -> None:
    capture = FIXTURES / "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
    rc, names = imported("parse", "nccl", str(capture))
    assert rc == 0
    assert not names & set(SUITE), sorted(names & set(SUITE))
    rc, names = imported("checks")
    assert rc == 0
    assert not names & set(DATA), sorted(names & set(DATA))


def test_upgrade_mark_loads_no_data_libraries(tmp_path: Path) -> None:
    """The real path of `upgrade mark` (inventory, client, a request to an API server that is
    down): exit 3, and neither pandas nor pyarrow was loaded to get there."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {
            "server": f"https://127.0.0.1:{closed_port()}", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "down", "user": {"token": "x"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "down"}}]}))
    inventory = write_inventory(tmp_path / "inv", ("u1",), prefix="gpu.example.com",
                                kubeconfig=kubeconfig)
    rc, names = imported("upgrade", "mark", "-i", str(inventory), "--node", "u1",
                         "--state", "upgrading")
    assert rc == 3
    assert {"ansible", "kubernetes"} <= names  # it did read the inventory and try the API
    assert not names & set(DATA), sorted(names & set(DATA))


def test_the_trace_sees_pandas_where_a_command_needs_it(tmp_path: Path) -> None:
    rc, names = imported("history", str(tmp_path))
    assert "pandas" in names, (rc, sorted(names))
