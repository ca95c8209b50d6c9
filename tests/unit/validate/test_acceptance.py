"""``validate acceptance`` (validate/acceptance.py): the Pod's log judged, and the run against a
real kube-apiserver.

The log is the rendered acceptance script run for real by this machine's ``/bin/sh`` with its
real ``dd`` and ``sha256sum``; ``all_reduce_perf`` there replays a real capture
(tests/fixtures/nccl-tests, 8x A100-SXM4-80GB, NCCL 2.16.2), since no GPU is here. The lab runs
the same script in a Pod, through Kueue, on its busybox image (tests/lab/test_cluster.py).

Against a real API server with the pinned Kueue CRDs and no Kueue controller (none runs in the
unit tier): without Kueue's Workload CRD nothing is submitted; with it (the release's own file,
from the source `make setup` builds Kueue from), the Job is submitted suspended and never
admitted: the run says Kueue made no Workload, fails the pool under ``pool:<name>`` and writes
its report beside ``latest`` without moving it; a Job deleted while the run waits is named.
An API server that is not there stops the run with exit 3 and leaves no run behind.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.kube_helpers import LocalApiServer, core_api, running_apiserver
from tests.unit.validate.cluster_inventories import REPO, lab_copy
from tests.unit.validate.test_cluster_apply import CONTROLLERS, install_crds, run_cli
from validate import acceptance
from validate.checks.base import Verdict
from validate.cluster.render import ACCEPTANCE_SCRIPT
from validate.cluster.spec import CostBaseline, load_spec
from validate.cost import PoolCapacity
from validate.model import ExitCode, Status
from validate.profiles import Band

CAPTURE = (REPO / "tests/fixtures/nccl-tests"
           / "all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
BAND = Band(warn=200.0, fail=150.0)


def script_log(tmp_path: Path, corrupt: bool = False, dd_time: bool = True) -> str:
    """The rendered acceptance script's output, run here (real sh, dd and sha256sum).
    ``dd_time=False``: GNU dd without its transfer line (``status=noxfer``), as Debian's
    busybox dd prints (records in and out only)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "all_reduce_perf"
    tool.write_text(f"#!/bin/sh\ncat {CAPTURE}\n")
    tool.chmod(0o755)
    if not dd_time:
        dd = bin_dir / "dd"
        dd.write_text(f'#!/bin/sh\nexec {shutil.which("dd")} "$@" status=noxfer\n')
        dd.chmod(0o755)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    script = ACCEPTANCE_SCRIPT.replace("/checkpoint", str(checkpoint))
    if corrupt:  # the checkpoint changed between its write and its read
        script = script.replace('echo "# gpuready acceptance: checkpoint-read"',
                                f"echo x >> {checkpoint}/ckpt.bin\n"
                                'echo "# gpuready acceptance: checkpoint-read"')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUS": "8",
           "NCCL_BYTES": "1073741824", "CHECKPOINT_MIB": "4"}
    proc = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == (1 if corrupt else 0), proc.stderr
    return proc.stdout + proc.stderr


def by_metric(verdicts: list[tuple[str, Verdict]]) -> dict[str, Verdict]:
    return {f"{check}/{v.metric}": v for check, v in verdicts}


def test_the_real_script_s_log_is_split_and_judged(tmp_path: Path) -> None:
    log = script_log(tmp_path)
    assert list(acceptance.sections(log)) == ["nccl", "checkpoint-write", "checkpoint-read",
                                              "done"]
    got = by_metric(acceptance.judge_log(log, 8, BAND))
    assert got["acceptance.gpus/gpus"].status is Status.PASS
    assert got["acceptance.gpus/gpus"].value == 8
    # The capture's out-of-place bus bandwidth at its largest size (1 GiB): 231.72 GB/s.
    busbw = got["acceptance.nccl/busbw_gbps"]
    assert (busbw.status, busbw.value) == (Status.PASS, 231.72)
    assert got["acceptance.nccl/wrong_results"].status is Status.PASS
    assert got["acceptance.checkpoint/verified"].status is Status.PASS
    for metric in ("write_mbps", "read_mbps"):
        rate = got[f"acceptance.checkpoint/{metric}"].value
        assert rate is not None and rate > 0


def test_a_low_band_fails_fewer_gpus_fail_and_a_changed_checkpoint_fails(
        tmp_path: Path) -> None:
    got = by_metric(acceptance.judge_log(script_log(tmp_path), 16, Band(warn=400.0,
                                                                         fail=300.0)))
    assert got["acceptance.gpus/gpus"].status is Status.FAIL
    assert "saw 8 GPU(s)" in got["acceptance.gpus/gpus"].detail
    assert got["acceptance.nccl/busbw_gbps"].status is Status.FAIL
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    got = by_metric(acceptance.judge_log(script_log(corrupt, corrupt=True), 8, BAND))
    verified = got["acceptance.checkpoint/verified"]
    assert (verified.status, verified.code) == (Status.FAIL, "acceptance.checkpoint_mismatch")
    assert "FAILED" in verified.detail


def test_a_log_without_the_script_s_markers_is_an_error() -> None:
    got = acceptance.judge_log("exec /bin/sh: no such file or directory\n", 8, BAND)
    assert [(c, v.status, v.code) for c, v in got] == [
        ("acceptance.nccl", Status.ERROR, "acceptance.no_output")]


def test_checkpoint_rates_come_from_uptime_when_dd_prints_no_time(tmp_path: Path) -> None:
    log = script_log(tmp_path, dd_time=False)
    assert " copied, " not in log
    assert "records out" in log
    got = by_metric(acceptance.judge_log(log, 8, BAND))
    for metric in ("write_mbps", "read_mbps"):
        rate = got[f"acceptance.checkpoint/{metric}"].value
        assert rate is not None and rate > 0
    # 4 MiB within one 10 ms tick of /proc/uptime counts as 10 ms: at most 419 MB/s.
    assert acceptance.dd_rate_mbps("checkpoint bytes 4194304 uptime 10.00 10.00\n") == \
        pytest.approx(4194304 / 0.01 / 1e6)
    assert acceptance.dd_rate_mbps("4+0 records in\n4+0 records out\n") is None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("acceptance"), 26, CONTROLLERS) as found:
        install_crds(found.kubeconfig)
        core_api(found).create_namespace({"metadata": {"name": "gpu-operator"}})
        yield found


def test_a_cluster_without_kueue_gets_nothing_submitted(server: LocalApiServer,
                                                         tmp_path: Path) -> None:
    """The queues' CRDs (what `cluster apply` needs) but not Kueue's Workload: no Kueue runs
    there, so a Job would wait for ever; the run says so before it submits anything."""
    inv = lab_copy(tmp_path, "cluster")
    code, _, err = run_cli("cluster", "apply", "-i", str(inv), "--kubeconfig",
                           str(server.kubeconfig))
    assert code == ExitCode.OK, err
    reports = tmp_path / "reports"
    code, out, err = run_cli("acceptance", "-i", str(inv), "--kubeconfig",
                             str(server.kubeconfig), "--timeout", "3", "--out", str(reports),
                             "--run-id", "acc-1")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, (out, err)
    assert (f"error: Kueue is not installed on {server.url}: the API serves no "
            "workloads.kueue.x-k8s.io/v1beta2") in err
    assert "nothing was submitted" in err
    assert list(reports.iterdir()) == []
    from kubernetes import client  # noqa: PLC0415

    batch = client.BatchV1Api(core_api(server).api_client)
    assert batch.list_job_for_all_namespaces().items == []


def test_an_api_server_that_is_not_there_stops_the_run_and_leaves_nothing(
        tmp_path: Path, server: LocalApiServer) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = yaml.safe_load(server.kubeconfig.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dead = tmp_path / "kubeconfig"
    dead.write_text(yaml.safe_dump(kubeconfig))
    inv = lab_copy(tmp_path, "cluster")
    reports = tmp_path / "reports"
    code, out, err = run_cli("acceptance", "-i", str(inv), "--kubeconfig", str(dead),
                             "--timeout", "3", "--out", str(reports))
    assert code == ExitCode.UNREACHABLE, (out, err)
    assert f"cannot reach the Kubernetes API at https://127.0.0.1:{port}" in err
    assert list(reports.iterdir()) == []


def test_without_kueue_s_manager_the_job_waits_and_a_deleted_job_is_named(
        server: LocalApiServer, tmp_path: Path) -> None:
    from kubernetes import client  # noqa: PLC0415

    from lab.kueue import build as kueue_build  # noqa: PLC0415

    crd = (kueue_build.source_dir() / "config/components/crd/bases"
           / "kueue.x-k8s.io_workloads.yaml")
    if not crd.is_file():
        pytest.skip(f"Kueue's source is not here ({crd}): `make setup` builds Kueue from it")
    api_client = core_api(server).api_client
    ext = client.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(yaml.safe_load(crd.read_text()))
    inv = lab_copy(tmp_path, "cluster")
    assert run_cli("cluster", "apply", "-i", str(inv), "--kubeconfig",
                   str(server.kubeconfig))[0] == ExitCode.OK
    reports = tmp_path / "reports"
    deadline = time.monotonic() + 30
    while True:  # the new CRD served (its storage answers 429 for a moment)
        code, out, err = run_cli("acceptance", "-i", str(inv), "--kubeconfig",
                                 str(server.kubeconfig), "--timeout", "2", "--out",
                                 str(reports), "--run-id", f"acc-{int(time.monotonic())}")
        if ("Kueue is not installed" not in err and "429" not in err) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == ExitCode.CHECK_FAILED, (out, err)
    assert "not admitted: Kueue made no Workload for the Job" in out
    batch = client.BatchV1Api(api_client)

    def delete_when_submitted() -> None:
        for _ in range(200):
            jobs = batch.list_namespaced_job(
                "research", label_selector="gpuready.io/acceptance-run=acc-deleted").items
            if jobs:
                # The API's default for a Job orphans its Pods: the Job keeps a finalizer
                # for the garbage collector (not running here) and is "being deleted".
                batch.delete_namespaced_job(jobs[0].metadata.name, "research")
                return
            time.sleep(0.1)

    deleter = threading.Thread(target=delete_when_submitted)
    deleter.start()
    started = time.monotonic()
    code, out, err = run_cli("acceptance", "-i", str(inv), "--kubeconfig",
                             str(server.kubeconfig), "--timeout", "60", "--out", str(reports),
                             "--run-id", "acc-deleted")
    deleter.join()
    assert time.monotonic() - started < 30, "the run waited for a Job that was gone"
    assert code == ExitCode.CHECK_FAILED, (out, err)
    rows = pd.read_parquet(reports / "acc-deleted" / "results.parquet")
    assert rows[["node", "check", "code"]].values.tolist() == [
        ["pool:pool-h100-sxm", "acceptance.queue", "acceptance.not_admitted"],
        ["pool:pool-h100-sxm", "acceptance.cost", "acceptance.no_cost_view"]]
    assert "the Job was deleted while the run waited for it" in rows.iloc[0]["detail"]
    summary = (reports / "acc-deleted" / "summary.md").read_text()
    assert "gpuready lab: SIMULATED GPUs" in summary
    assert rows.iloc[1]["detail"] == f"no validation run at {reports / 'latest'}"


def _view(effective: float | None, **changes: object) -> PoolCapacity:
    base = PoolCapacity("pool_h100_sxm", 2, 16, 8, 8, (), 0.0, "USD", 59.45, effective,
                        (), (), ())
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_cost_is_compared_with_the_pool_s_baseline(tmp_path: Path) -> None:
    spec = load_spec(lab_copy(tmp_path, "cluster"))
    pool = spec.pool("pool_h100_sxm")
    assert pool.cost_baseline == CostBaseline(3.0, "illustrative on-demand H100 rental price "
                                                   "(not a quote)")
    # Half the pool out doubles what an accepted GPU-hour costs: above the baseline, a warning.
    above = acceptance.cost_verdict(pool, {pool.group: _view(7.43)}, "validation run r1")
    assert (above.status, above.code, above.value, above.warn) == (
        Status.WARN, "acceptance.cost_above_baseline", 7.43, 3.0)
    assert "7.43 USD per accepted GPU-hour (8 of 16 GPUs accepted; validation run r1) " \
           "against 3.00 (illustrative" in above.detail
    below = acceptance.cost_verdict(pool, {pool.group: _view(2.9)}, "validation run r1")
    assert (below.status, below.unit) == (Status.PASS, "USD/GPU-h")
    # What cannot be compared says why, and judges nothing.
    missing = acceptance.cost_verdict(
        pool, {pool.group: _view(None, missing=("network",))}, "validation run r1")
    assert (missing.status, missing.value) == (Status.SKIP, None)
    assert "no effective cost for pool pool_h100_sxm (missing network)" in missing.detail
    none = acceptance.cost_verdict(pool, None, "no validation run at reports/latest")
    assert (none.status, none.detail) == (Status.SKIP, "no validation run at reports/latest")
    bare = dataclasses.replace(pool, cost_baseline=None)
    assert acceptance.cost_verdict(bare, None, "").code == "acceptance.no_cost_baseline"
