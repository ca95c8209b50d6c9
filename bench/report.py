"""Report build time and peak memory for synthetic fleets: 1,000 and 10,000 nodes x 40 rows.

Rows go through the real path: CheckResult records -> to_frame -> write_report (every file,
plots included). Each size runs in a fresh subprocess so peak RSS is that size's own.

    .venv/bin/python -m bench.report [--sizes 1000 10000] [--checks 40] [--browser]

Goals (issue 4): 10,000 nodes under 15 s and 2 GiB; 10k time under 12x the 1k time.
The report's CPU time is printed beside its wall time: on a shared machine the wall time swings
with other load, the CPU time much less. The size of index.html is printed too (the page embeds
every row for its per-node view). ``--browser`` also opens each page in headless Chromium and
times the node table, a status filter and a node's view.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from validate.model import CheckResult, Status
from validate.report import write_report
from validate.results import to_frame

REPO = Path(__file__).resolve().parent.parent

# Real (check, metric, unit) shapes, padded with per-GPU ECC rows to reach 40 per node.
BASE = [
    ("node.services", "inactive_units", "units"), ("gpu.driver", "driver_version", ""),
    ("gpu.count", "gpu_count", ""), ("gpu.model", "gpu_model", ""),
    ("gpu.memory", "memory_total_mib", "MiB"), ("gpu.pcie", "pcie_width", "lanes"),
    ("gpu.pcie", "pcie_gen", "gen"), ("gpu.persistence", "persistence_disabled_gpus", "gpus"),
    ("gpu.throttle", "throttle_reasons", "gpus"), ("gpu.nvlink", "nvlinks_active_min", "links"),
    ("gpu.topology", "gpus_in_matrix", ""), ("gpu.topology", "pairs_without_nvlink", "pairs"),
    ("gpu.xid", "xid_events", "events"), ("fabric.ib", "active_ports", "ports"),
    ("fabric.ib", "min_rate_gbps", "Gb/s"), ("storage.fio", "seq_write_mibps", "MiB/s"),
    ("storage.fio", "seq_read_mibps", "MiB/s"), ("storage.fio", "randread_4k_iops", "IOPS"),
    ("storage.checkpoint", "write_gbps", "GB/s"), ("storage.checkpoint", "read_gbps", "GB/s"),
    ("nccl.allreduce", "busbw_gbps", "GB/s"), ("nccl.allreduce", "wrong_results", "count"),
]


def shapes(n: int) -> list[tuple[str, str, str]]:
    extra = [("gpu.ecc", f"gpu{i // 5}_ecc_{i % 5}", "count") for i in range(max(0, n - len(BASE)))]
    return (BASE + extra)[:n]


CHROMIUM = Path("/usr/bin/chromium")


def browse(index: Path) -> dict[str, float]:
    """Seconds until the page shows its node table, until a status filter has redrawn it, and
    until a node's view is open: Debian's chromium, headless, through Playwright."""
    from playwright.sync_api import sync_playwright  # noqa: PLC0415  # only with --browser

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update"])
        page = ctx.new_page()
        t0 = time.perf_counter()
        page.goto(index.as_uri())
        page.wait_for_selector("#nodes tbody tr[data-node]")
        t1 = time.perf_counter()
        page.select_option("#f-status", "fail")
        page.wait_for_function("document.getElementById('shown').textContent.includes('filtered')")
        t2 = time.perf_counter()
        page.click("#nodes tbody tr[data-node] a")
        page.wait_for_selector("#node-rows")
        t3 = time.perf_counter()
        ctx.close()
    return {"page_load_s": round(t1 - t0, 2), "filter_s": round(t2 - t1, 2),
            "node_view_s": round(t3 - t2, 2)}


def one(nodes: int, checks: int, browser: bool = False) -> dict[str, float]:
    rng = np.random.default_rng(nodes)
    pools = ["pool_h100_sxm", "pool_a100_sxm", "pool_l40s_pcie"]
    statuses = [Status.PASS, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP]
    status_idx = rng.choice(5, size=(nodes, checks), p=[0.95, 0.02, 0.015, 0.01, 0.005])
    values = rng.normal(480, 15, size=(nodes, checks))
    shape = shapes(checks)
    start = time.perf_counter()
    rows = [
        CheckResult("bench", "2026-12-02T12:00:00+00:00", f"gpu-{n:05d}", pools[n % 3],
                    "h100-sxm5-80gb-8x", check, metric, float(values[n, c]), unit, 470.0, 460.0,
                    statuses[status_idx[n, c]],
                    "ok" if status_idx[n, c] in (0, 4) else f"{check}.synthetic",
                    "" if status_idx[n, c] == 0 else "synthetic detail", 0.1)
        for n in range(nodes) for c, (check, metric, unit) in enumerate(shape)
    ]
    built = time.perf_counter()
    cpu_built = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        report = write_report(to_frame(rows), Path(out), "bench")
        done = time.perf_counter()
        cpu_done = time.process_time()
        sizes = {p.name: p.stat().st_size for p in report.run_dir.iterdir()}
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        seen = browse(report.run_dir / "index.html") if browser else {}
    return {"nodes": nodes, "rows": len(rows), "records_s": round(built - start, 2),
            "report_s": round(done - built, 2), "report_cpu_s": round(cpu_done - cpu_built, 2),
            "peak_mib": round(peak_kib / 1024, 1),
            "html_mib": round(sizes["index.html"] / 2**20, 1), **seen}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--checks", type=int, default=40)
    ap.add_argument("--browser", action="store_true",
                    help="also time the page in headless chromium (/usr/bin/chromium)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.checks, args.browser)))
        return 0
    results = []
    for size in args.sizes:
        proc = subprocess.run([sys.executable, __file__, "--one", str(size), "--checks",
                               str(args.checks), *(["--browser"] if args.browser else [])],
                              capture_output=True, text=True, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        print(f"{res['nodes']:>6} nodes x {args.checks} rows = {res['rows']:>7} rows: "
              f"report {res['report_s']:6.2f} s, CPU {res['report_cpu_s']:6.2f} s "
              f"(records {res['records_s']:.2f} s), peak RSS {res['peak_mib']:.0f} MiB, "
              f"index.html {res['html_mib']:.1f} MiB")
        if "page_load_s" in res:
            print(f"        in chromium: table drawn {res['page_load_s']:.2f} s after opening, "
                  f"status filter {res['filter_s']:.2f} s, "
                  f"a node's view {res['node_view_s']:.2f} s")
    if len(results) >= 2:
        ratio = results[-1]["report_s"] / max(results[0]["report_s"], 1e-9)
        cpu_ratio = results[-1]["report_cpu_s"] / max(results[0]["report_cpu_s"], 1e-9)
        print(f"time ratio {results[-1]['nodes']}/{results[0]['nodes']} nodes: {ratio:.1f}x "
              f"(CPU {cpu_ratio:.1f}x; goal < 12x); goal for 10k: < 15 s, < 2048 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
