"""What the validators must report for each scale harness endpoint (tests/lab/test_scale.py and
bench/scale.py): the status and code of every row, per failure mode and lab fault."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from lab.scale.plan import Endpoint

# Every row of such a node has this status and code (a check the profile skips, such as NVLink on
# a PCIe pool, may still say so when the transport works: stall).
WHOLE_NODE = {
    "refuse": ("error", "host.unreachable"),  # TCP connection refused
    "drop": ("error", "host.unresponsive"),  # connection cut mid-output
    # every command hangs until the wrapper's timeout, the liveness probe (`true`) too: the node
    # has stopped answering, and its first timed-out check and all after it say so (issue 28)
    "stall": ("error", "host.unresponsive"),
}
# At least one row of such a node has this status and code, and no row errs.
FAULT = {
    "gpu-missing": ("fail", "gpu.count.missing"),
    "ecc-uncorrectable": ("fail", "gpu.ecc.uncorrectable"),
    "pcie-degraded": ("fail", "gpu.pcie.degraded"),
    "xid-79": ("fail", "gpu.xid.79"),
    "driver-not-loaded": ("fail", "gpu.driver.not_loaded"),
}
HEALTHY = {"pass", "skip"}


def rows_by_node(results_csv: Path) -> dict[str, list[dict[str, str]]]:
    by: dict[str, list[dict[str, str]]] = defaultdict(list)
    with results_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            by[row["node"]].append(row)
    return by


def problems(endpoints: Iterable[Endpoint], by_node: dict[str, list[dict[str, str]]],
             checks: int) -> list[str]:
    """One line per node reported wrongly (missing, too few rows, wrong status or code)."""
    out = []
    expected = {e.name: e for e in endpoints}
    for name in sorted(set(by_node) - set(expected)):
        out.append(f"{name}: reported but not served")
    for name, e in expected.items():
        rows = by_node.get(name, [])
        got = {(r["status"], r["code"]) for r in rows}
        if len({r["check"] for r in rows}) != checks:
            out.append(f"{name}: {len({r['check'] for r in rows})} of {checks} checks reported")
        elif e.failure in WHOLE_NODE:
            allowed = {WHOLE_NODE[e.failure], *([("skip", "ok")] if e.failure == "stall" else [])}
            if WHOLE_NODE[e.failure] not in got or got - allowed:
                out.append(f"{name} ({e.failure}): {sorted(got)}")
        elif e.faults:
            want = FAULT[e.faults[0]]
            if want not in got or any(s == "error" for s, _ in got):
                out.append(f"{name} ({e.faults[0]}): {sorted(got)}, wanted {want}")
        elif {s for s, _ in got} - HEALTHY:
            out.append(f"{name} ({e.failure or 'healthy'}): {sorted(got)}")
    return out
