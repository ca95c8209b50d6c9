"""The CLI in-process: injected streams, exit codes from the one table, parse/report/run."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import validate.report_page
from tests.conftest import REPO_ROOT, closed_port
from validate.cli import main
from validate.model import ExitCode
from validate.run_cli import PARSERS


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


REAL = {
    "nvidia-smi-xml": "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml",
    "nvidia-smi-q": "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt",
    "nvidia-smi-nvlink": "nvidia-smi-nvlink/a100-sxm4-80gb-nvlink-s-12links-ok.txt",
    "nvidia-smi-topo": (
        "nvidia-smi-topo/a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt"
    ),
    "nccl": "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt",
    "fio-json": "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json",
    "ibstat": "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt",
    "ibstatus": "ibstat/ibstatus-a100-hdr200-all-active.txt",
    "xid": "dmesg-xid/xid63-row-remapper-new-row-marked.txt",
    "nvidia-smi-csv": "nvidia-smi-csv/tesla-p100-query-gpu-header-units.csv",
    "dpkg-query": "drift-lab/dpkg-query-show-debian12-converged-node.txt",
    "containerd-config-dump": "drift-lab/containerd-1.6.20-config-dump-nvidia-runtime.toml",
}


def test_every_parser_format_is_reachable() -> None:
    assert set(REAL) | {"nccl-json"} == set(PARSERS)


@pytest.mark.parametrize("fmt", sorted(REAL))
def test_parse_prints_json_for_real_captures(fixtures_dir: Path, fmt: str) -> None:
    code, out, err = _main("parse", fmt, str(fixtures_dir / REAL[fmt]))
    assert (code, err) == (0, "")
    assert json.loads(out)


def test_parse_values_and_errors(fixtures_dir: Path, tmp_path: Path) -> None:
    _, out, _ = _main("parse", "nvidia-smi-nvlink", str(fixtures_dir / REAL["nvidia-smi-nvlink"]))
    doc = json.loads(out)
    assert doc[0]["index"] == 7 and doc[0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert len(doc[0]["links"]) == 12
    _, out, _ = _main("parse", "xid", str(fixtures_dir / REAL["xid"]))
    assert json.loads(out)[0]["xid"] == 63
    garbage = tmp_path / "g.xml"
    garbage.write_text("<nvidia_smi_log><gpu>")
    code, _, err = _main("parse", "nvidia-smi-xml", str(garbage))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "parse error" in err
    code, _, err = _main("parse", "nvidia-smi-xml", str(tmp_path / "missing"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "No such file" in err


def test_usage_errors_and_help() -> None:
    assert _main()[0] == ExitCode.USAGE_OR_TOOL_ERROR
    assert _main("parse", "no-such-format", "x")[0] == ExitCode.USAGE_OR_TOOL_ERROR
    code, out, _ = _main("--help")
    assert code == ExitCode.OK and "run" in out
    code, out, _ = _main("checks")
    assert code == ExitCode.OK and "nccl.allreduce" in out


def _inventory(root: Path, hosts: str) -> Path:
    (root / "group_vars").mkdir(parents=True)
    (root / "hosts.yml").write_text(hosts)
    (root / "group_vars" / "pool_h100_sxm.yml").write_text("gpu_profile: h100-sxm5-80gb-8x\n")
    return root


def test_run_unreachable_host_exit_3_and_rows(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path / "inv",
        f"""
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            dead-01: {{ansible_host: 127.0.0.1, ansible_port: {closed_port()}}}
""",
    )
    code, out, err = _main(
        "run",
        "-i",
        str(inv),
        "--checks",
        "gpu.*,node.services",
        "--out",
        str(tmp_path / "reports"),
        "--run-id",
        "t1",
    )
    assert code == ExitCode.UNREACHABLE, err
    assert "[1/1] dead-01: error" in err and "report:" in out
    run_dir = tmp_path / "reports" / "t1"
    rows = pd.read_parquet(run_dir / "results.parquet")
    assert len(rows) == 13 and set(rows["code"]) == {"host.unreachable"}
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["run_id"], info["inventory"], info["limit"], info["exit_code"]) == (
        "t1", str(inv.resolve()), None, ExitCode.UNREACHABLE)
    assert info["checks_requested"] == "gpu.*,node.services" and len(info["checks"]) == 13
    assert [p["nodes"] for p in info["profiles"]] == [["dead-01"]]
    # render again from the stored results and run.json: the same files, byte for byte
    before = {f.name: f.read_bytes() for f in run_dir.iterdir()}
    code, out, _ = _main("report", str(run_dir))
    assert code == ExitCode.UNREACHABLE and "UNREACHABLE" in out
    assert {f.name: f.read_bytes() for f in run_dir.iterdir()} == before


def test_run_local_connection_missing_tools_is_a_tool_error(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path / "inv",
        """
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            here: {ansible_connection: local}
""",
    )
    code, _, err = _main(
        "run",
        "-i",
        str(inv),
        "--checks",
        "fabric.ib",
        "--out",
        str(tmp_path / "reports"),
        "--run-id",
        "t2",
        "--limit",
        "here",
    )
    assert code in (ExitCode.USAGE_OR_TOOL_ERROR, ExitCode.CHECK_FAILED, ExitCode.OK), err
    rows = pd.read_csv(tmp_path / "reports" / "t2" / "results.csv")
    assert set(rows["node"]) == {"here"} and set(rows["check"]) == {"fabric.ib"}


def test_run_bad_inputs_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = _main("run", "-i", str(tmp_path / "nope"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "does not exist" in err
    inv = _inventory(
        tmp_path / "inv",
        "all:\n  children:\n    gpu_nodes:\n      children:\n"
        "        pool_h100_sxm:\n          hosts:\n            a: {}\n",
    )
    out = str(tmp_path / "reports")
    for argv, message in [
        (("--checks", "gpu.nope"), "no check matches"),
        # zero selected checks would run nothing and exit 0
        (("--checks", ","), "names no check"),
        (("--checks", ""), "names no check"),
        (("--limit", "zzz"), "--limit term 'zzz' matches no host"),
        (("--limit", "a,zzz"), "--limit term 'zzz' matches no host"),
        # to Ansible an empty pattern is no limit: every host instead of the few meant
        (("--limit", ","), "',' names no host or group"),
        (("--limit", ""), "'' names no host or group"),
        (("--limit", " : "), "' : ' names no host or group"),
        (("--run-id", "../escape"), "invalid run id '../escape'"),
        (("--run-id", "a/b"), "invalid run id 'a/b'"),
        (("--run-id", "latest"), "invalid run id 'latest'"),
        (("--run-id", ".hidden"), "invalid run id '.hidden'"),
        (("--run-id", "x.partial"), "invalid run id 'x.partial'"),
        (("--timeout", "nan"), "--timeout: must be a finite number > 0"),
        (("--timeout", "0"), "--timeout: must be a finite number > 0"),
        (("--node-deadline", "inf"), "--node-deadline: must be a finite number > 0"),
        (("--concurrency", "0"), "--concurrency: must be >= 1"),
        (("--max-output-mib", "-1"), "--max-output-mib: must be a finite number > 0"),
    ]:
        code, _, err = _main("run", "-i", str(inv), "--out", out, *argv)
        assert code == ExitCode.USAGE_OR_TOOL_ERROR and message in err, (argv, err)
        assert "Traceback" not in err
    # nothing was reserved or written by any of them
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").iterdir())


def _dead_host_inventory(tmp_path: Path) -> Path:
    return _inventory(
        tmp_path / "inv",
        f"""
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            dead-01: {{ansible_host: 127.0.0.1, ansible_port: {closed_port()}}}
""",
    )


def test_run_ids_are_unique_and_run_directories_never_reused(tmp_path: Path) -> None:
    inv = _dead_host_inventory(tmp_path)
    out = tmp_path / "reports"
    dirs = set()
    for _ in range(3):  # well within one second
        code, stdout, _ = _main("run", "-i", str(inv), "--checks", "gpu.count", "--out", str(out))
        assert code == ExitCode.UNREACHABLE
        dirs.add(stdout.split("report: ")[1].split("\n")[0])
    assert len(dirs) == 3 and all(Path(d).parent == out for d in dirs)
    code, _, _ = _main("run", "-i", str(inv), "--checks", "gpu.count", "--out", str(out),
                       "--run-id", "fixed")
    assert code == ExitCode.UNREACHABLE
    before = {p.name: p.stat().st_mtime_ns for p in (out / "fixed").iterdir()}
    code, _, err = _main("run", "-i", str(inv), "--checks", "gpu.count", "--out", str(out),
                         "--run-id", "fixed")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "never reused" in err
    assert {p.name: p.stat().st_mtime_ns for p in (out / "fixed").iterdir()} == before
    # no half-built or reserved directory is left behind
    assert not [p for p in out.iterdir() if p.name.endswith(".partial") or p.name.startswith(".")]
    assert (out / "latest").resolve() == (out / "fixed").resolve()


def test_unwritable_out_fails_before_any_connection(tmp_path: Path) -> None:
    # A real listener that counts connections stands in for the node.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    inv = _inventory(
        tmp_path / "inv",
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
        f"          hosts:\n            n1: {{ansible_host: 127.0.0.1, "
        f"ansible_port: {listener.getsockname()[1]}}}\n",
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    try:
        code, _, err = _main("run", "-i", str(inv), "--out", str(blocker / "reports"))
        assert code == ExitCode.USAGE_OR_TOOL_ERROR
        assert f"cannot create the output directory {blocker / 'reports'}" in err
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected
    finally:
        listener.close()


@pytest.mark.parametrize("argv, message", [
    (("fabric", "--limit", ","), "--limit: ',' names no host or group"),
    (("gate", "--limit", ""), "--limit: '' names no host or group"),
    (("gate", "--log", "/etc"), "--log: '/etc' is a directory"),
    (("gate", "--log", "/proc/gate.log"), "--log: '/proc/gate.log' is under /proc"),
    (("gate", "--log", "/dev/null"), "--log: '/dev/null' exists and is not a regular file"),
    (("upgrade", "plan", "--limit", ", ,"), "--limit: ', ,' names no host or group"),
])
def test_empty_selections_and_unusable_output_paths_stop_before_any_connection(
        tmp_path: Path, argv: tuple[str, ...], message: str) -> None:
    """Each is a usage error before the inventory is read, so before any connection: a real
    listener stands in for the node (and, for the gate, the API server) and counts them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    inv = _inventory(
        tmp_path / "inv",
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
        f"          hosts:\n            n1: {{ansible_host: 127.0.0.1, ansible_port: {port}}}\n")
    with (inv / "group_vars" / "pool_h100_sxm.yml").open("a") as f:
        f.write("gpuready_label_prefix: gpu.example.com\n"
                f"gpuready_kubeconfig: {tmp_path / 'kubeconfig'}\n")
    before = sorted(tmp_path.rglob("*"))
    try:
        code, out, err = _main(*argv[:2 if argv[0] == "upgrade" else 1], "-i", str(inv),
                               *argv[2 if argv[0] == "upgrade" else 1:])
        assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
        assert message in err and "Traceback" not in err, err
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    assert sorted(tmp_path.rglob("*")) == before


def test_an_unexpected_exception_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here: the plots raise) ends in one line naming what failed, exit 2, never a
    traceback's exit 1; the rows of the run are still on disk."""
    def broken(*args: object) -> dict[str, str]:
        raise RuntimeError("matplotlib fell over")

    monkeypatch.setattr(validate.report_page, "plots", broken)
    inv = _dead_host_inventory(tmp_path)
    code, _, err = _main("run", "-i", str(inv), "--checks", "gpu.count", "--out",
                         str(tmp_path / "reports"), "--run-id", "bug")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    last = err.strip().splitlines()[-1]
    assert last == ("error: validate run (writing the report) failed: RuntimeError: "
                    "matplotlib fell over"), err
    assert "Traceback" not in err
    rows = (tmp_path / "reports" / "bug.partial" / "rows.jsonl").read_text().splitlines()
    assert len(rows) == 1 and json.loads(rows[0])["code"] == "host.unreachable"


def _closed_pipe() -> int:
    """The write end of a pipe whose reader has already gone (`| head` once it has its lines):
    every write to it fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def _validate_proc(*argv: str, stdout: int, stderr: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "validate", *argv], cwd=REPO_ROOT,
                          stdout=stdout, stderr=stderr, text=True, timeout=120, check=False)


def test_parse_into_a_closed_pipe_is_quiet_and_succeeds(fixtures_dir: Path) -> None:
    """`python -m validate parse ... | head`: no BrokenPipe error line, no traceback, exit 0."""
    w = _closed_pipe()
    try:
        proc = _validate_proc("parse", "nvidia-smi-xml", str(fixtures_dir / REAL["nvidia-smi-xml"]),
                              stdout=w, stderr=subprocess.PIPE)
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (ExitCode.OK, "")


def test_run_whose_readers_went_away_still_reports_with_its_own_exit_code(tmp_path: Path) -> None:
    """Progress (stderr) and result lines (stdout) both into closed pipes: the run still writes
    its report and exits with the run's code, not a pipe error."""
    inv = _inventory(
        tmp_path / "inv",
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
        f"          hosts:\n            dead-01: {{ansible_host: 127.0.0.1, "
        f"ansible_port: {closed_port()}}}\n",
    )
    out_w, err_w = _closed_pipe(), _closed_pipe()
    try:
        proc = _validate_proc("run", "-i", str(inv), "--checks", "gpu.count", "--out",
                              str(tmp_path / "reports"), "--run-id", "piped",
                              stdout=out_w, stderr=err_w)
    finally:
        os.close(out_w)
        os.close(err_w)
    assert proc.returncode == ExitCode.UNREACHABLE
    rows = pd.read_csv(tmp_path / "reports" / "piped" / "results.csv")
    assert set(rows["code"]) == {"host.unreachable"}



def test_commands_that_read_runs_do_not_load_the_plotting_library() -> None:
    """The run store (validate.results) is apart from the page that plots (issue 30)."""
    code = ("import contextlib, io, sys\nfrom validate.cli import main\n"
            "for command in ('gate', 'history', 'cost', 'drift'):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        main([command, '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
