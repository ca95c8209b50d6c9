"""Issue 28: a check that could not measure never passes, a threshold that cannot judge is
refused, no node drops out of the report.

Every failure here is real: a real dd stopped by a real file size limit, stand-ins on PATH
for tools that lie (a dd that claims bytes it did not copy, a df whose figure the shell cannot
compare, a fio printing 100,000 nested brackets, an all_reduce_perf that exits 1 after a clean
table, the real journalctl pointed at an empty journal directory), and inventories and
command lines that the validator must refuse before it connects to anything (a listening
socket proves nothing connected).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import resource
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from validate import cli, runner
from validate.checks import select
from validate.checks.base import ToolFailure
from validate.checks.storage import judge_checkpoint, judge_fio
from validate.inventory import InventoryError, Node, load
from validate.model import CheckResult, ExitCode, Status
from validate.parsers import fio
from validate.profiles import PROFILES_DIR, Band, ProfileError, load_profile
from validate.report import write_report
from validate.transport.local import LocalTransport

# This module's listener (the project's unit-test range is 127.0.21/22.x).
ADDRESS = "127.0.22.28"
MIB = 2**20


def _node(name: str = "n1", profile: str = "a100-sxm4-80gb-8x", **vars_: object) -> Node:
    return Node(name=name, address="127.0.0.1", port=22, user="root", connection="local",
                key_file=None, known_hosts=None, accept_unknown_host_keys=False,
                pool="pool_a100_sxm", profile=profile, gpu_pool={"fabric": "infiniband"},
                vars=dict(vars_))


def _tool(bin_dir: Path, name: str, body: str) -> None:
    """A stand-in for ``name`` on PATH (a POSIX sh script)."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def _local(bin_dir: Path) -> LocalTransport:
    return LocalTransport("n1", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.stat().st_size)
            for p in sorted(root.rglob("*"))}


@pytest.fixture()
def scratch(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    (d / "someone-elses-file").write_text("keep me")
    return d


@contextlib.contextmanager
def _file_size_limit(limit_bytes: int) -> Iterator[None]:
    """RLIMIT_FSIZE for this process and what it starts (ulimit -f; systemd's LimitFSIZE=)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- storage.checkpoint's dd


def test_a_dd_that_fails_is_an_error_row_quoting_dd_never_a_pass(scratch: Path,
                                                                 tmp_path: Path) -> None:
    """The real dd, stopped by a real file size limit after 4 MiB of a 16 MiB checkpoint:
    before issue 28 the script ignored dd's status and reported the time as a write rate."""
    before = _tree(scratch)
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_a100_sxm:\n"
        "          hosts:\n            here: {ansible_connection: local}\n")
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "all.yml").write_text(
        f"gpu_profile: a100-sxm4-80gb-8x\ngpuready_checkpoint_path: {scratch}\n"
        "gpuready_checkpoint_size_mib: 16\n")
    with _file_size_limit(4 * MIB):
        code, out, err = _main("run", "-i", str(inv), "--checks", "storage.checkpoint",
                               "--out", str(tmp_path / "reports"), "--run-id", "fsize")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, out + err
    rows = pd.read_parquet(tmp_path / "reports" / "fsize" / "results.parquet")
    assert list(rows["status"]) == ["error"] and list(rows["code"]) == ["tool.exit_nonzero"]
    detail = rows["detail"].iloc[0]
    assert "dd (write) exited 1: dd: error writing" in detail and "File too large" in detail
    assert "Traceback" not in err
    assert _tree(scratch) == before  # the partial file went with its directory


@pytest.mark.parametrize(("dd", "message"), [
    # exits 0 at once, copies nothing, says nothing
    ("exit 0\n", "dd (write) exited 0 without saying how many bytes it copied"),
    # claims success with a summary line that does not add up
    ('echo "1048576 bytes (1.0 MB, 1.0 MiB) copied, 0.5 s, 2.1 MB/s" >&2\nsleep 0.05\n',
     "dd (write) copied 1048576 bytes of the 16777216 asked (16 MiB)"),
], ids=["silent", "short"])
def test_a_dd_that_lies_is_implausible_not_a_figure(scratch: Path, tmp_path: Path, dd: str,
                                                    message: str) -> None:
    _tool(tmp_path / "bin", "dd", dd)
    node = _node(gpuready_checkpoint_path=str(scratch), gpuready_checkpoint_size_mib=16)
    rows = runner.run_node(node, select("storage.checkpoint"), "r1", _local(tmp_path / "bin"))
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "tool.implausible")]
    assert rows[0].detail == message and rows[0].value is None


def test_timings_below_the_floor_or_above_the_ceiling_are_not_measurements() -> None:
    band = Band(2.0, 1.0)
    asked = 2048 * MIB
    ok = f"write_rc=0\nwrite_bytes={asked}\nread_rc=0\nread_bytes={asked}\nread_ns=900000000\n"
    # The report: "2048 MiB in 0.00 s", 860 GB/s
    with pytest.raises(ToolFailure) as fast:
        judge_checkpoint(ok + "write_ns=2496000\n", 2048, band, band)
    assert fast.value.code == "tool.implausible"
    assert "860.4 GB/s, above the 100 GB/s one dd can move" in fast.value.detail
    with pytest.raises(ToolFailure) as instant:
        judge_checkpoint(ok + "write_ns=400000\n", 2048, band, band)
    assert "took 0.400 ms, under the 1 ms floor" in instant.value.detail
    with pytest.raises(ToolFailure) as backwards:  # a clock stepped back during the write
        judge_checkpoint(ok + "write_ns=-5000000\n", 2048, band, band)
    assert "under the 1 ms floor" in backwards.value.detail
    w, r = judge_checkpoint(ok + "write_ns=1000000000\n", 2048, band, band)
    assert (w.value, w.status, r.status) == (2.147, Status.PASS, Status.PASS)


def test_a_free_space_figure_the_shell_cannot_compare_refuses(scratch: Path,
                                                              tmp_path: Path) -> None:
    """A df whose 'Available' column is not a number: `[ x -lt N ]` fails as an error, which
    an `if` read as "enough space" before issue 28 (dash: "Illegal number")."""
    _tool(tmp_path / "bin", "df", 'echo "Filesystem 1024-blocks Used Available Capacity '
                                  'Mounted on"\necho "/dev/x 100 1 9e99 1% /"\n')
    node = _node(gpuready_checkpoint_path=str(scratch), gpuready_checkpoint_size_mib=1)
    rows = runner.run_node(node, select("storage.checkpoint"), "r1", _local(tmp_path / "bin"))
    assert [(r.status, r.code) for r in rows] == [(Status.FAIL, "storage.no_space")]
    assert "9e99 KiB free" in rows[0].detail


# ---------------------------------------------------------------- fio, nccl, journalctl


def test_fio_printing_100k_deep_json_is_a_parse_error_row(scratch: Path, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    depth = 100_000
    _tool(tmp_path / "bin", "fio",
          f"printf '{{\"jobs\": '\nhead -c {depth} /dev/zero | tr '\\0' '['\n"
          f"head -c {depth} /dev/zero | tr '\\0' ']'\necho '}}'\n")
    node = _node(gpuready_scratch_path=str(scratch), gpuready_fio_size_mib=1)
    with caplog.at_level(logging.WARNING):
        rows = runner.run_node(node, select("storage.fio"), "r1", _local(tmp_path / "bin"))
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "tool.parse_error")]
    assert "nested too deeply" in rows[0].detail
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback logged


def test_a_fio_job_that_moved_nothing_is_not_a_figure(fixtures_dir: Path) -> None:
    """The real fio 3.33 report, its write job's bytes and time zeroed (a job that did no I/O:
    a bandwidth of 0 would read as 'slow disk', and a cached one as 'fast disk')."""
    text = (fixtures_dir / "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-"
                           "disk.json").read_text()
    run = fio.parse_json(text)
    bands = {m: Band(1.0, 0.5) for m in ("seq_write_mibps", "seq_read_mibps", "randread_4k_iops")}
    assert {v.status for v in judge_fio(run, bands)} == {Status.PASS}
    doc = text.replace('"io_bytes" : 7987003392', '"io_bytes" : 0', 1)
    assert doc != text
    with pytest.raises(ToolFailure) as nothing:
        judge_fio(fio.parse_json(doc), bands)
    assert nothing.value.code == "tool.implausible" and "moved 0 bytes" in nothing.value.detail


def test_all_reduce_perf_exiting_1_after_a_clean_table_is_an_error(fixtures_dir: Path,
                                                                    tmp_path: Path) -> None:
    """nccl-tests exits 1 for wrong results; a clean table with exit 1 (a rank that crashed
    after it) passed before issue 28. The same table with exit 0 passes."""
    table = fixtures_dir / "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
    for rc, expected in ((1, (Status.ERROR, "tool.exit_nonzero")), (0, (Status.PASS, "ok"))):
        _tool(tmp_path / "bin", "all_reduce_perf",
              f"cat {table}\necho 'rank 3: segfault at teardown' >&2\nexit {rc}\n")
        rows = runner.run_node(_node(), select("nccl.allreduce"), "r1", _local(tmp_path / "bin"))
        busbw = rows[0]
        assert (busbw.status, busbw.code) == expected, busbw
        if rc:
            assert "exited 1 but reported no wrong results" in busbw.detail
            assert "segfault at teardown" in busbw.detail


def test_journalctl_without_a_journal_is_an_error_not_a_quiet_log(tmp_path: Path) -> None:
    """The real journalctl, pointed at an empty journal directory: it exits 0, prints
    "-- No entries --" and says "No journal files were found." on stderr."""
    real = shutil.which("journalctl")
    if real is None:
        pytest.skip("journalctl (systemd) is not installed here")
    empty = tmp_path / "journal"
    empty.mkdir()
    _tool(tmp_path / "bin", "journalctl", f'exec {real} --directory={empty} "$@"\n')
    rows = runner.run_node(_node(), select("gpu.xid"), "r1", _local(tmp_path / "bin"))
    assert [(r.status, r.code) for r in rows] == [(Status.ERROR, "gpu.xid.journal_unreadable")]
    assert rows[0].detail == "journalctl read no kernel log: No journal files were found."


# ---------------------------------------------------------------- refused before connecting


@contextlib.contextmanager
def _listener() -> Iterator[socket.socket]:
    """Where the inventory's hosts point: a connection attempt would be accepted here."""
    sock = socket.socket()
    sock.bind((ADDRESS, 0))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def _nothing_connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def _pools_inventory(root: Path, port: int, pools: dict[str, str]) -> Path:
    """One host per pool (``n-<pool>``), each pool's group_vars as given."""
    hosts = "".join(f"        {pool}:\n          hosts:\n            n-{pool}: "
                    f"{{ansible_host: {ADDRESS}, ansible_port: {port}}}\n" for pool in pools)
    (root / "group_vars").mkdir(parents=True)
    (root / "hosts.yml").write_text(
        f"all:\n  children:\n    gpu_nodes:\n      children:\n{hosts}")
    for pool, text in pools.items():
        (root / "group_vars" / f"{pool}.yml").write_text(text)
    return root


GOOD = "gpu_profile: h100-sxm5-80gb-8x\n"


@pytest.mark.parametrize(("pool_vars", "said"), [
    ("gpu_thresholds: {nccl: {allreduce_busbw_gbps: {warn: .nan, fail: .nan}}}\n",
     "gpu_thresholds (set in group pool_b, host n-pool_b) is not usable: "
     "thresholds.nccl.allreduce_busbw_gbps.warn: nan is not a finite number"),
    ("gpu_thresholds: {nccl: {allreduce_busbw_gbps: {fail: .inf}}}\n",
     "thresholds.nccl.allreduce_busbw_gbps.fail: inf is not a finite number"),
    ("gpu_thresholds: {nccl: {allreduce_busbw_gpbs: {fail: 400}}}\n",
     "unknown key of nccl 'allreduce_busbw_gpbs'; did you mean 'allreduce_busbw_gbps'?"),
    ("gpu_thresholds: {ncl: {allreduce_busbw_gbps: {fail: 400}}}\n",
     "thresholds.ncl: unknown section 'ncl'; did you mean 'nccl'?"),
    ("gpu_thresholds: {nccl: {allreduce_busbw_gbps: {fial: 400}}}\n",
     "unknown band key 'fial'; did you mean 'fail'?"),
    ("gpu_thresholds: {nccl: {allreduce_busbw_gbps: {warn: null, fail: null}}}\n",
     "allreduce_busbw_gbps: sets neither warn nor fail, so it would pass any figure"),
    ("gpu_thresholds: {fio: {timeout_s: .nan}}\n",
     "thresholds.fio.timeout_s: nan is not a finite number"),
    ("gpu_thresholds: {fio: {timeout_s: -1}}\n", "thresholds.fio.timeout_s: -1 is out of range"),
    ("gpu_thresholds: {fio: {timeout_s: 1.0e+9}}\n",
     "thresholds.fio.timeout_s: 1000000000.0 is out of range (expected a finite number from "
     "0.001 to 86400 s)"),
    ("gpu_thresholds: {fio: {runtime_s: .nan}}\n",
     "thresholds.fio.runtime_s: expected an integer from 1 to 86400 s, got a number (nan)"),
    ("gpu_thresholds: {xid: {fail_codes: \"79\"}}\n",
     "thresholds.xid.fail_codes: expected a list, got a string ('79')"),
    ("gpu_thresholds: {throttle: {fail_reasons: [hw_slowdwon]}}\n",
     "unknown value 'hw_slowdwon'; did you mean 'hw_slowdown'?"),
    ("gpu_thresholds: {checkpoint: {size_mib: 1000000000000000000000000000000}}\n",
     "thresholds.checkpoint.size_mib: 1000000000000000000000000000000 is out of range"),
    ("gpuready_fio_size_mib: 9000000000000000\n",
     "gpuready_fio_size_mib (set in group pool_b, host n-pool_b) is 9000000000000000 MiB, more "
     "than the 1073741824 MiB (1 PiB) a storage check may write"),
    ("gpuready_checkpoint_size_mib: 1000000000000000000000000000000\n",
     "gpuready_checkpoint_size_mib (set in group pool_b, host n-pool_b) is "
     "1000000000000000000000000000000 MiB, more than"),
    ("gpuready_drive_class: nvme-gen44\n",
     "gpuready_drive_class (set in group pool_b, host n-pool_b) is not usable: unknown drive "
     "class 'nvme-gen44'; did you mean 'nvme-gen4'?"),
], ids=["nan-band", "inf-fail", "misspelt-metric", "misspelt-section", "misspelt-band-key",
        "empty-band", "fio-timeout-nan", "fio-timeout-negative", "fio-timeout-1e9",
        "fio-runtime-nan", "xid-codes-string", "throttle-reason", "checkpoint-size-threshold",
        "fio-size-9e15", "checkpoint-size-1e30", "drive-class"])
def test_a_value_that_cannot_judge_or_run_is_refused_before_connecting(
        tmp_path: Path, pool_vars: str, said: str) -> None:
    """Beside a good pool, one pool's bad value refuses the inventory: exit 2, the variable and
    where it was set named, nothing connected to, no run directory made."""
    with _listener() as sock:
        port = sock.getsockname()[1]
        inv = _pools_inventory(tmp_path / "inv", port, {"pool_a": GOOD,
                                                        "pool_b": GOOD + pool_vars})
        code, _, err = _main("run", "-i", str(inv), "--out", str(tmp_path / "reports"))
        assert _nothing_connected(sock)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, err
    assert said in err, err
    assert "nothing was connected to" in err and "Traceback" not in err
    assert "pool_a" not in err  # the good pool is not blamed
    assert not (tmp_path / "reports").exists()


def test_a_host_with_an_integer_profile_is_refused_not_dropped(tmp_path: Path) -> None:
    """`gpu_profile: 42` in a second pool: before issue 28 the host vanished from run and gate
    ("[1/1] n-ok: pass", exit 0) and, alone, read as "no GPU nodes ... match None"."""
    said = ("gpu_profile (set in group pool_b, host n-pool_b) is an integer (42), not a profile "
            "name")
    # a run that validated the good host, for the gate to read
    row = CheckResult("r1", "2026-01-01T00:00:00+00:00", "n-pool_a", "pool_a",
                      "h100-sxm5-80gb-8x", "node.services", "inactive_units", 0.0, "units",
                      None, None, Status.PASS, "ok", "", 0.1)
    run_dir = write_report([row], tmp_path / "reports", "r1").run_dir
    with _listener() as sock:
        port = sock.getsockname()[1]
        inv = _pools_inventory(tmp_path / "inv", port, {"pool_a": GOOD,
                                                        "pool_b": "gpu_profile: 42\n"})
        alone = _pools_inventory(tmp_path / "alone", port, {"pool_b": "gpu_profile: 42\n"})
        for argv in (["run", "-i", str(inv)], ["run", "-i", str(alone)],
                     ["run", "-i", str(inv), "--limit", "n-pool_b"],
                     ["gate", "-i", str(inv), "--run", str(run_dir), "--dry-run"]):
            code, _, err = _main(*argv, *(["--out", str(tmp_path / "r")] if argv[0] == "run"
                                          else []))
            assert code == ExitCode.USAGE_OR_TOOL_ERROR, (argv, err)
            assert said in err, (argv, err)
            assert "no GPU nodes" not in err
        assert _nothing_connected(sock)
    # Limited to the good pool, the bad host is not selected (as Ansible's --limit), and the
    # inventory loads; limited to the bad host, it is refused by name.
    assert [n.name for n in load(inv, limit="pool_a")] == ["n-pool_a"]
    with pytest.raises(InventoryError, match=r"gpu_profile \(set in group pool_b"):
        load(inv, limit="pool_b")


@pytest.mark.parametrize(("argv", "said"), [
    (["run", "--ssh-timeout", "1e9"],
     "--ssh-timeout: must be a finite number > 0 and at most 3600 seconds, not '1e9'"),
    (["run", "--timeout", "1e9"], "--timeout: must be a finite number > 0 and at most 86400"),
    (["run", "--node-deadline", "1e12"], "--node-deadline: must be a finite number > 0"),
    (["run", "--max-output-mib", "1e9"],
     "--max-output-mib: must be a finite number > 0 and at most 4096 MiB"),
    (["run", "--concurrency", "1000000"], "--concurrency: must be >= 1 and <= 4096"),
    (["run", "--out", ""], "--out: must name a file or directory, not ''"),
    (["run", "--out", " "], "--out: must name a file or directory, not ' '"),
    (["fabric", "--concurrency", "0"], "--concurrency: must be >= 1"),
    (["fabric", "--out", ""], "--out: must name a file or directory"),
    (["drift", "--margin", "nan"], "--margin: must be a fraction from 0 up to 1, not 'nan'"),
    (["drift", "--timeout", "inf"], "--timeout: must be a finite number > 0"),
    (["drift", "--keep-days", "-1"], "--keep-days: must be a finite number > 0"),
    (["drift", "--check-timeout", "0"], "--check-timeout: must be >= 1"),
    (["drift", "--forks", "0"], "--forks: must be >= 1"),
    (["drift", "--baseline-runs", "0"], "--baseline-runs: must be >= 1"),
    (["drift", "--node-deadline", "nan"], "--node-deadline: must be a finite number > 0"),
    (["drift", "--node-deadline", "1e12"],
     "--node-deadline: must be a finite number > 0 and at most 604800 seconds"),
    (["drift", "--check-task-timeout", "0"], "--check-task-timeout: must be >= 1"),
    (["drift", "--check-task-timeout", "1e9"], "--check-task-timeout: not an integer"),
    (["drift", "--check-task-timeout", "100000"],
     "--check-task-timeout: must be >= 1 and <= 86400"),
    (["drift", "--kubeconfig", ""], "--kubeconfig: must name a file or directory"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_numeric_and_path_option_is_checked(tmp_path: Path, argv: list[str],
                                                  said: str) -> None:
    with _listener() as sock:
        inv = _pools_inventory(tmp_path / "inv", sock.getsockname()[1], {"pool_a": GOOD})
        code, _, err = _main(argv[0], "-i", str(inv), *argv[1:])
        assert _nothing_connected(sock)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and said in err, err
    assert "Traceback" not in err and "TypeError" not in err
    assert not list(Path.cwd().glob("*.partial"))  # --out '' wrote nothing here


def test_history_and_report_refuse_empty_paths_and_counts() -> None:
    for argv, said in ((["report", ""], "run_dir: must name a file or directory"),
                       (["history", "x", "--min-runs", "-3"], "--min-runs: must be >= 1"),
                       (["history", "x", "--margin", "1.5"], "--margin: must be a fraction")):
        code, _, err = _main(*argv)
        assert code == ExitCode.USAGE_OR_TOOL_ERROR and said in err, (argv, err)


def test_a_profile_file_reports_every_problem(tmp_path: Path) -> None:
    """A profile with a NaN band, a misspelt hardware key and a string where a number goes:
    each named with its key, in one error, with the closest known name."""
    d = tmp_path / "profiles"
    shutil.copytree(PROFILES_DIR, d)
    f = d / "h100-sxm5-80gb-8x.yml"
    text = f.read_text()
    text = text.replace("allreduce_busbw_gbps: {warn: 470, fail: 460, better: higher}",
                        "allreduce_busbw_gbps: {warn: .nan, fail: 460, better: higher}")
    text = text.replace("nvlinks_per_gpu: 18", "nvlink_per_gpu: 18")
    text = text.replace("nic_rate_gbps: 400", "nic_rate_gbps: .inf")
    f.write_text(text)
    with pytest.raises(ProfileError) as err:
        load_profile("h100-sxm5-80gb-8x", profiles_dir=d)
    assert dict(err.value.problems) == {
        "hardware.nvlink_per_gpu": "unknown hardware key 'nvlink_per_gpu'; did you mean "
                                   "'nvlinks_per_gpu'? (known: gpu_count, gpu_memory_mib, "
                                   "gpu_model, nic_count, nic_rate_gbps, nvlinks_per_gpu, "
                                   "nvswitch, pcie_gen, pcie_width)",
        "hardware.nvlinks_per_gpu": "missing",
        "hardware.nic_rate_gbps": "inf is not a finite number (expected a finite number from 0 "
                                  "to 3200 Gb/s)",
        "thresholds.nccl.allreduce_busbw_gbps.warn": "nan is not a finite number (expected a "
                                                     "finite number from 0 to 5000 GB/s)",
    }
    assert str(err.value).startswith(f"{f}: ")
