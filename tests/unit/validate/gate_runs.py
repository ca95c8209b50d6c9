"""Real validation runs on disk for the gate's tests, and the ways a run goes wrong.

A run here is what ``validate run`` writes for healthy 8x H100 nodes, every check of the
registry, judged by the checks' own ``judge_*`` functions:

- 13 checks on real captures (tests/unit/validate/real_fleet.py's H100 captures, by node name);
- ``node.services`` on ``systemctl is-active``'s answer for the four units (one state a line);
- ``dcgm.diag`` on the real all-pass ``dcgmi diag`` JSON capture of 8 GPUs (DCGM 3.1.0); its
  opt-in levels 2 and 3 are the skip rows a run without them writes;
- ``nccl.allreduce`` on the 8x A100 single-node nccl-tests capture (no single-node H100
  capture exists), which is why the inventory lowers the pool's NCCL floor to it;
- ``storage.checkpoint`` measured for real on this machine (the runner's local transport, 8
  MiB in a temporary directory), which is why the inventory lowers its floors;
- ``gpu.xid`` of a node given a fault (``xid-79``: fallen off the bus, a hardware fault;
  ``xid-48``: a double-bit ECC error, cleared by a reset): the lab simulator's driver lines
  (lab/sim/lab_kmsg.py, in the real driver's wording), parsed and judged as any kernel log.

The rows are written by the project's report code (validate/report.py ``write_report``, with
run.json from ``runinfo.start``), then aged, narrowed, cut or damaged on disk the way a stale,
partial, NaN or empty run is.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from lab.hardware import render_host
from lab.sim.lab_kmsg import xid_lines
from tests.unit.validate import real_fleet
from validate import checks as check_registry
from validate import runinfo
from validate.checks import Verdict
from validate.checks.base import ToolFailure, parsed
from validate.checks.dcgm import judge_diag
from validate.checks.gpu import judge_xid
from validate.checks.nccl import judge_allreduce
from validate.checks.node import expected_units, judge_services
from validate.inventory import Node, load, profile_for
from validate.model import CheckResult, Status
from validate.parsers import dcgmi_diag, nccl, xid
from validate.report import write_report
from validate.runner import run_node
from validate.transport.local import LocalTransport

POOL = "pool_h100_sxm"
NCCL_CAPTURE = "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
DCGM_CAPTURE = "dcgmi/diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt"


def write_inventory(root: Path, hosts: Sequence[str], *, prefix: str, kubeconfig: Path,
                    extra: dict[str, Any] | None = None,
                    host_vars: dict[str, dict[str, Any]] | None = None) -> Path:
    """An inventory of ``hosts`` in the H100 pool, set for the gate (prefix, kubeconfig)."""
    scratch = root.parent / f"{root.name}-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    (root / "group_vars").mkdir(parents=True, exist_ok=True)
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "children": {POOL: {"hosts": {
            h: {"ansible_host": "192.0.2.1", **(host_vars or {}).get(h, {})}
            for h in hosts}}}}}}}))
    (root / "group_vars" / f"{POOL}.yml").write_text(yaml.safe_dump({
        "gpu_profile": "h100-sxm5-80gb-8x", "nvidia_driver_version": "535.161.08",
        "gpu_pool": {"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                     "fabric": "infiniband", "workload": "distributed-training",
                     "sharing": "full-gpu"},
        "gpuready_drive_class": "virtual", "gpuready_checkpoint_path": str(scratch),
        "gpuready_checkpoint_size_mib": 8,
        "gpu_thresholds": {
            # The A100 capture's 231.72 GB/s stands in for an H100's (see the docstring).
            "nccl": {"allreduce_busbw_gbps": {"warn": 228, "fail": 220, "better": "higher"}},
            # A shared virtual disk under other load.
            "checkpoint": {"write_gbps": {"warn": 0.002, "fail": 0.001, "better": "higher"},
                           "read_gbps": {"warn": 0.002, "fail": 0.001, "better": "higher"}}},
        "gpuready_label_prefix": prefix, "gpuready_kubeconfig": str(kubeconfig),
        **(extra or {})}))
    return root


def _row(run_id: str, time: str, node: Node, profile: str, check: str, v: Verdict
         ) -> CheckResult:
    return CheckResult(run_id, time, node.name, node.pool, profile, check, v.metric, v.value,
                       v.unit, v.warn, v.fail, v.status, v.code, v.detail, 0.25)


def node_rows(fixtures_dir: Path, node: Node, run_id: str, time: str,
              fault: str | None = None) -> list[CheckResult]:
    """Every check's rows for ``node`` (module docstring), in the registry's order."""
    profile = profile_for(node)
    judged: dict[str, Callable[[], list[Verdict]]] = real_fleet.judges(fixtures_dir, node,
                                                                        profile)
    judged["node.services"] = lambda: judge_services(
        expected_units(profile.hardware.nvswitch), "active\nactive\nactive\nactive\n")
    run = parsed(nccl.parse_text, (fixtures_dir / NCCL_CAPTURE).read_text(), "all_reduce_perf")
    judged["nccl.allreduce"] = lambda: judge_allreduce(
        [run, run, run], profile.band("nccl.allreduce_busbw_gbps"))
    diag = dcgmi_diag.parse((fixtures_dir / DCGM_CAPTURE).read_text())
    judged["dcgm.diag"] = lambda: judge_diag(diag, 1)
    for level in (2, 3):
        judged[f"dcgm.diag_r{level}"] = lambda level=level: [Verdict(  # type: ignore[misc]
            "", Status.SKIP, "ok", f"level {level} is opt-in")]
    # These nodes declare no dcgm-exporter (the check's skip row).
    judged["dcgm.exporter"] = lambda: [Verdict(
        "", Status.SKIP, "ok", "no DCGM exporter declared for the node")]
    if fault is not None:
        lines = "\n".join(xid_lines(fault, render_host("h100-sxm5-8x", node.name)))
        assert lines, f"the lab renders no kernel lines for {fault}"
        judged["gpu.xid"] = lambda: judge_xid(
            xid.parse(lines), "-24h", [], [], [], profile.value("xid.severity_status", dict))
    rows: list[CheckResult] = []
    for cid, check in check_registry.REGISTRY.items():
        if cid == "storage.checkpoint":
            measured = run_node(node, [check], run_id, LocalTransport())
            rows += [dataclasses.replace(r, time=time) for r in measured]
            continue
        try:
            verdicts = judged[cid]()
        except ToolFailure as exc:
            verdicts = [Verdict("", exc.status, exc.code, exc.detail)]
        rows += [_row(run_id, time, node, profile.name, cid, v) for v in verdicts]
    return rows


def write_run(fixtures_dir: Path, inventory: Path, reports: Path, run_id: str,
              measured: datetime, *, faults: Mapping[str, str] | None = None,
              checks: str | None = None, limit: str | None = None) -> Path:
    """A run of the nodes of ``inventory`` (``limit``: an Ansible pattern) measured at
    ``measured``, as ``validate run [--checks CHECKS]`` writes it, ``faults`` by node; returns
    the run directory."""
    nodes = load(inventory, limit)
    time = measured.isoformat(timespec="seconds")
    selected = [c.id for c in check_registry.select(checks)]
    rows = [r for n in nodes
            for r in node_rows(fixtures_dir, n, run_id, time, (faults or {}).get(n.name))
            if r.check in selected]
    info = runinfo.start(run_id=run_id, environment=None, inventory=inventory, limit=limit,
                         checks_requested=checks, checks=selected, nodes=nodes)
    info = dataclasses.replace(info, started=time, finished=time)
    return write_report(rows, reports, run_id, run_info=info, update_latest=False).run_dir


# -- what goes wrong with a run on disk -------------------------------------------------------
def _rewrite(run_dir: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    """Apply ``change`` to the run's results, in both files the report wrote."""
    table = pq.read_table(run_dir / "results.parquet")
    df = change(table.to_pandas())
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False)
                   if set(df.columns) == set(table.schema.names) else
                   pa.Table.from_pandas(df, preserve_index=False), run_dir / "results.parquet")
    df.to_csv(run_dir / "results.csv", index=False)


def age(run_dir: Path, by: timedelta) -> None:
    """Make the run older by ``by``: its rows' times and run.json's."""
    def older(text: str) -> str:
        return (datetime.fromisoformat(text) - by).isoformat(timespec="seconds")

    _rewrite(run_dir, lambda df: df.assign(time=df["time"].map(older)))
    doc = json.loads((run_dir / "run.json").read_text())
    doc["started"], doc["finished"] = older(doc["started"]), older(doc["finished"])
    (run_dir / "run.json").write_text(json.dumps(doc, indent=2) + "\n")


def cut_after(run_dir: Path, last_check: str) -> None:
    """Cut the results after ``last_check``'s rows (a file cut short; run.json still lists
    every check)."""
    def cut(df: pd.DataFrame) -> pd.DataFrame:
        order = list(check_registry.REGISTRY)
        keep = set(order[: order.index(last_check) + 1])
        return df[df["check"].isin(keep)].reset_index(drop=True)

    _rewrite(run_dir, cut)


def set_value(run_dir: Path, check: str, metric: str, value: float) -> None:
    def edit(df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        df.loc[(df["check"] == check) & (df["metric"] == metric), "value"] = value
        return df

    _rewrite(run_dir, edit)


def empty(run_dir: Path) -> None:
    """Keep the header, drop every row."""
    _rewrite(run_dir, lambda df: df.iloc[0:0])


def drop_column(run_dir: Path, column: str) -> None:
    _rewrite(run_dir, lambda df: df.drop(columns=[column]))


def csv_only_with_status(run_dir: Path, row: int, status: str) -> None:
    """Keep only results.csv (an older run), with row ``row``'s status replaced."""
    df = pd.read_csv(run_dir / "results.csv", keep_default_na=False)
    df.loc[row, "status"] = status
    df.to_csv(run_dir / "results.csv", index=False)
    (run_dir / "results.parquet").unlink()


def now_utc() -> datetime:
    return datetime.now(UTC)
