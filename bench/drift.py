"""Drift and history benchmarks (issue 10).

    python -m bench.drift history [--runs 365] [--nodes 1000] [--checks 40]
    python -m bench.drift lab [--nodes 8]
    python -m bench.drift              (both)

history: a synthetic reports root of RUNS run directories, each with a results.parquet of
NODES x CHECKS rows in the validators' schema (written with pyarrow the way write_report
writes them), then, each in a fresh subprocess so that its peak RSS is its own:

- ``series``: one node's every figure (validate.history.node_series + summarise), the query
  behind `python -m validate history <root> --node N`;
- ``fleet``: every node's latest value against its baseline (validate.history.fleet_table);
- ``baseline``: the same one-node series the simple way, one pandas.read_parquet per run file
  in a Python loop (what the columnar dataset scan replaces), side by side for the ratio.

Goal: series and fleet each under 3 s and 2 GiB at 365 x 1,000 x 40.

lab: boots an N-host lab of the drift fleet (root; honours GPUREADY_LAB_*), converges node1,
copies it to the others (lab/clone.py), validates once (history), then times one full drift
run (all layers) and reports its wall time and the control node's CPU seconds per host (this
process and its children: ansible-playbook and its workers). The lab is stopped at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from validate.model import COLUMNS

REPO = Path(__file__).resolve().parent.parent

# Figures a drift run judges, then other real (check, metric) shapes, padded to CHECKS.
FIGURE_SHAPES = [
    ("nccl.allreduce", "busbw_gbps"), ("storage.fio", "seq_write_mibps"),
    ("storage.fio", "seq_read_mibps"), ("storage.fio", "randread_4k_iops"),
    ("storage.checkpoint", "write_gbps"), ("storage.checkpoint", "read_gbps"),
    ("gpu.pcie", "pcie_width"), ("gpu.pcie", "pcie_gen"),
]
OTHER = [("node.services", "inactive_units"), ("gpu.count", "gpu_count"),
         ("gpu.memory", "memory_total_mib"), ("gpu.persistence", "persistence_disabled_gpus"),
         ("gpu.xid", "xid_events"), ("fabric.ib", "active_ports"),
         ("nccl.allreduce", "wrong_results")]


def shapes(n: int) -> list[tuple[str, str]]:
    extra = [("gpu.ecc", f"gpu{i // 5}_ecc_{i % 5}") for i in range(n)]
    return (FIGURE_SHAPES + OTHER + extra)[:n]


def write_history(root: Path, runs: int, nodes: int, checks: int) -> float:
    rng = np.random.default_rng(7)
    shape = shapes(checks)
    n = nodes * checks
    node_names = np.array([f"gpu-{i:05d}" for i in range(nodes)])
    pools = np.array(["pool_h100_sxm", "pool_a100_sxm", "pool_l40s_pcie"])
    check_names = np.array([c for c, _ in shape])
    metric_names = np.array([m for _, m in shape])
    statuses = np.array(["pass", "warn", "fail", "error", "skip"])
    base = rng.normal(400, 40, size=(nodes, checks))
    started = time.perf_counter()
    for r in range(runs):
        run_id = f"2026{(r // 28) % 12 + 1:02d}{r % 28 + 1:02d}T{r % 24:02d}0000Z-{r:04d}"
        values = (base * rng.normal(1.0, 0.015, size=base.shape)).reshape(-1)
        st = rng.choice(5, size=n, p=[0.95, 0.02, 0.015, 0.01, 0.005])
        node_idx = np.repeat(np.arange(nodes), checks)
        check_idx = np.tile(np.arange(checks), nodes)
        data = {
            "run_id": pa.array([run_id] * n),
            "time": pa.array([f"2026-01-01T00:00:{r % 60:02d}+00:00"] * n),
            "node": pa.array(node_names[node_idx]),
            "pool": pa.array(pools[node_idx % 3]),
            "profile": pa.array(["p"] * n),
            "check": pa.array(check_names[check_idx]),
            "metric": pa.array(metric_names[check_idx]),
            "value": pa.array(values),
            "unit": pa.array([""] * n),
            "warn": pa.array(np.full(n, np.nan)),
            "fail": pa.array(np.full(n, np.nan)),
            "status": pa.array(statuses[st]),
            "code": pa.array(np.where(st == 0, "ok", "x")),
            "detail": pa.array([""] * n),
            "duration_s": pa.array(np.full(n, 0.1)),
        }
        assert list(data) == list(COLUMNS)
        run_dir = root / run_id
        run_dir.mkdir()
        pq.write_table(pa.table(data), run_dir / "results.parquet")
    return time.perf_counter() - started


def _measure(kind: str, root: str, node: str) -> None:
    """Child process: run one query, print its time and peak RSS as JSON."""
    import pandas as pd  # noqa: PLC0415

    from validate.history import (  # noqa: PLC0415
        BaselineSettings,
        fleet_table,
        node_series,
        run_files,
        summarise,
    )

    settings = BaselineSettings()
    started = time.perf_counter()
    if kind == "series":
        rows = len(summarise(node_series(Path(root), node), settings))
    elif kind == "fleet":
        rows = len(fleet_table(Path(root), settings))
    else:  # baseline: one file at a time, in a Python loop
        parts = []
        for f in run_files(Path(root)):
            df = pd.read_parquet(f, columns=["run_id", "node", "check", "metric", "value",
                                             "status"])
            parts.append(df[df["node"] == node])
        rows = len(pd.concat(parts))
    took = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"kind": kind, "seconds": round(took, 2), "peak_mib": round(peak_mib),
                      "rows": rows}))


def bench_history(runs: int, nodes: int, checks: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuready-bench-history-") as tmp:
        took = write_history(Path(tmp), runs, nodes, checks)
        size = sum(f.stat().st_size for f in Path(tmp).rglob("*.parquet")) / 2**20
        print(f"history: {runs} runs x {nodes} nodes x {checks} checks = "
              f"{runs * nodes * checks:,} rows, {size:.0f} MiB of Parquet (written in "
              f"{took:.0f} s)")
        results = {}
        for kind in ("series", "fleet", "baseline"):
            proc = subprocess.run([sys.executable, __file__, "_measure", kind, tmp,
                                   f"gpu-{nodes // 2:05d}"],
                                  capture_output=True, text=True, check=True)
            results[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = results[kind]
            print(f"  {kind:8} {r['seconds']:6.2f} s  peak {r['peak_mib']:5d} MiB  "
                  f"({r['rows']} rows)")
        ratio = results["baseline"]["seconds"] / max(results["series"]["seconds"], 1e-9)
        print(f"  one node's series: dataset scan {ratio:.1f}x faster than a per-file loop")
        for kind in ("series", "fleet"):
            r = results[kind]
            ok = r["seconds"] < 3 and r["peak_mib"] < 2048
            print(f"  goal {kind}: < 3 s and < 2 GiB: {'met' if ok else 'NOT met'}")


def bench_lab(nodes: int) -> None:
    import ansible_runner  # noqa: PLC0415

    from lab import clone, core  # noqa: PLC0415
    from lab.paths import LabPaths  # noqa: PLC0415
    from validate import cli  # noqa: PLC0415
    from validate.ansible_ssh import runner_settings  # noqa: PLC0415

    paths = LabPaths.default()
    names = [f"node{i}" for i in range(1, nodes + 1)]
    core.down(paths)
    core.up(paths, fleet="drift", nodes=nodes, log=False)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuready-bench-drift-") as tmp:
            env = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                   "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
            os.makedirs(f"{tmp}/runner")
            run = ansible_runner.run(private_data_dir=f"{tmp}/runner", project_dir=str(REPO),
                                     playbook=str(REPO / "playbooks" / "bootstrap.yml"),
                                     inventory=str(paths.inventory_dir), limit="node1",
                                     quiet=True,
                                     **runner_settings(paths.inventory_dir, Path(tmp),
                                                       envvars=env))
            if run.rc != 0:
                raise SystemExit(f"converge of node1 failed: {run.stats}")
            clone.clone(paths, "node1", names[1:])
            out = f"{tmp}/reports"
            if cli.main(["run", "-i", str(paths.inventory_dir), "--out", out],
                        stdout=io.StringIO(), stderr=io.StringIO()) != 0:
                raise SystemExit("validation of the fresh lab failed")
            before = (resource.getrusage(resource.RUSAGE_SELF),
                      resource.getrusage(resource.RUSAGE_CHILDREN))
            started = time.perf_counter()
            rc = cli.main(["drift", "-i", str(paths.inventory_dir), "--out", out],
                          stdout=io.StringIO(), stderr=io.StringIO())
            wall = time.perf_counter() - started
            after = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
            cpu = sum((a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime)
                      for a, b in zip(after, before, strict=True))
            meta = json.loads((Path(out) / "latest-drift" / "drift.json").read_text())
            print(f"lab: drift over {nodes} hosts: exit {rc}, {wall:.0f} s wall "
                  f"(check mode {meta['timings'].get('check_mode_s')} s, probes and "
                  f"performance {meta['timings'].get('probes_s')} s in parallel with it); "
                  f"control-node CPU {cpu / nodes:.1f} s per host")
            with open("/proc/loadavg") as load:
                print(f"  load average during the run: {load.read().split()[0]}")
    finally:
        core.down(paths)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "_measure":
        _measure(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="?", choices=("history", "lab", "all"), default="all")
    parser.add_argument("--runs", type=int, default=365)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--checks", type=int, default=40)
    parser.add_argument("--lab-nodes", type=int, default=8)
    args = parser.parse_args()
    if args.what in ("history", "all"):
        bench_history(args.runs, args.nodes, args.checks)
    if args.what in ("lab", "all"):
        bench_lab(args.lab_nodes)


if __name__ == "__main__":
    main()
