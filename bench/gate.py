"""The gate's reconcile on 1,000 Nodes, 1% of them needing a change, on a real kube-apiserver
(built from source, lab.kube.local) over HTTPS with the official client: wall time and API
calls per node, against a baseline run side by side (what a script of per-node
`kubectl label --overwrite` does: read each Node, patch each Node).

    .venv/bin/python -m bench.gate [--nodes 1000] [--changed 10] [--rounds 3]

The Nodes are created as a kubelet and the GPU Operator leave them (the status of a real
captured GPU Node, tests/fixtures/k8s-api, with 8 GPUs; the lab's GFD labels), the 99% already
carrying what the gate wants; the 1% just joined (tainted, unlabelled). Each round puts the 1%
back first; the baseline runs in the first round only. API calls are counted twice: by the
client and in the API server's audit log. Goal (issue 7): under 5 s, exactly one
list plus one patch per changed Node.

Then one round gates a newer run: every Node records the run that judged it (``last-run``,
``validated-at``, ``last-run-time``), so every Node is patched once; its time is reported,
not judged against the goal (it is the price of each Node naming its last judgement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.hardware import render_host
from lab.sim.daemons import gfd_labels
from tests.kube_helpers import core_api, running_apiserver
from validate.gate import KubeNodeApi, reconcile
from validate.labels import (
    Desired,
    GatePolicy,
    NodeEvidence,
    NodeIdentity,
    NodeResults,
    decide,
)
from validate.model import Status

REPO = Path(__file__).resolve().parent.parent

PREFIX = "gpu.example.com.node-restriction.kubernetes.io"
RUN = "20261202T101500Z"
MEASURED = "2026-12-02T10:15:00+00:00"
NEXT_RUN, NEXT_MEASURED = "20261203T101500Z", "2026-12-03T10:15:00+00:00"
TAINT = {"key": f"{PREFIX}/validation", "value": "pending", "effect": "NoSchedule"}
ADDRESS_HOST = 20  # 127.0.22.20
# A real Node's status (a GPU Operator node, 1 GPU), given 8 GPUs for the bench's SKU.
CAPTURED = (REPO / "tests/fixtures/k8s-api"
            / "kubectl-get-nodes-o-json-list-rke2-vgpu-a16-4q-gpu-operator.json")


def identity(name: str) -> NodeIdentity:
    return NodeIdentity(name=name, pool="pool_h100_sxm", profile="h100-sxm5-80gb-8x",
                        gpu_pool={"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                                  "fabric": "infiniband", "workload": "distributed-training",
                                  "sharing": "full-gpu"},
                        gpu_count=8, gpu_model="NVIDIA H100 80GB HBM3", gpu_memory_mib=81559,
                        nvswitch=True, nvlinks_per_gpu=18)


def evidence(run: str = RUN, measured: str = MEASURED) -> NodeEvidence:
    return NodeEvidence(run, measured, NodeResults(run, Status.PASS, (), 8, 81559, Status.PASS,
                                                   "NVIDIA H100 80GB HBM3"))


def desired_state(ident: NodeIdentity, labels: dict[str, str]) -> Desired:
    """What the gate sets on a Node that carries ``labels`` (GFD's)."""
    return decide(ident, evidence(), {"metadata": {"name": ident.name, "labels": labels}},
                  GatePolicy(PREFIX))


def captured_status() -> dict[str, Any]:
    status: dict[str, Any] = json.loads(CAPTURED.read_text())["items"][0]["status"]
    for key in ("capacity", "allocatable"):
        status[key]["nvidia.com/gpu"] = "8"
    return status


def seed(api: Any, count: int, changed: set[str]) -> None:
    """The Nodes, created through the API before the rounds (setup, not measured)."""
    hw = render_host("h100-sxm5-8x", "bench")
    status = captured_status()
    gfd = gfd_labels(hw, set(), "550.90.07", 1796200000)
    for i in range(count):
        name = f"gpu-{i:04d}"
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", **gfd}
        spec: dict[str, Any] = {}
        annotations: dict[str, str] = {}
        if name in changed:
            spec = {"taints": [TAINT]}
        else:
            wanted = desired_state(identity(name), dict(gfd))
            labels.update(wanted.labels)
            annotations.update(wanted.annotations)
        api.create_node({
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec, "status": {**status, "addresses": [
                {"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250 + 1}"},
                {"type": "Hostname", "address": name}]}})


def unadmit(api: Any, names: set[str]) -> None:
    """Put the changed Nodes back to just-joined (as the admin), before a round."""
    for name in sorted(names):
        node = api.read_node(name)
        labels = {k: None for k in node.metadata.labels if k.startswith(PREFIX)}
        notes = {k: None for k in node.metadata.annotations or {} if k.startswith(PREFIX)}
        api.patch_node(name, {"metadata": {"labels": labels, "annotations": notes},
                              "spec": {"taints": [TAINT]}},
                       _content_type="application/merge-patch+json")


def audit_counts(server: Any, since: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in server.audit()[since:]:
        counts[event["verb"]] = counts.get(event["verb"], 0) + 1
    return counts


def gate_round(server: Any, identities: list[NodeIdentity],
               table: dict[str, NodeEvidence]) -> tuple[float, dict[str, int], dict[str, int]]:
    since = len(server.audit())
    api = KubeNodeApi(server.kubeconfig)
    start = time.perf_counter()
    report = reconcile(api, identities, table, PREFIX)
    took = time.perf_counter() - start
    assert all(o.verdict == "passed" for o in report.nodes)
    return took, dict(api.calls), audit_counts(server, since)


def baseline_round(server: Any, identities: list[NodeIdentity]) -> tuple[float, dict[str, int]]:
    """Per node: read it, then patch the labels (kubectl label --overwrite, node by node)."""
    since = len(server.audit())
    api = core_api(server)
    start = time.perf_counter()
    for ident in identities:
        node = api.read_node(ident.name)
        wanted = desired_state(ident, {}).labels
        taints = [t for t in (node.spec.taints or []) if t.key != TAINT["key"]]
        api.patch_node(ident.name, {"metadata": {"labels": dict(wanted)},
                                    "spec": {"taints": [t.to_dict() for t in taints]}},
                       _content_type="application/merge-patch+json")
    return time.perf_counter() - start, audit_counts(server, since)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    changed = {f"gpu-{i:04d}" for i in range(0, args.nodes, max(1, args.nodes // args.changed))}
    with tempfile.TemporaryDirectory(prefix="gpuready-bench-gate-") as tmp:
        identities = [identity(f"gpu-{i:04d}") for i in range(args.nodes)]
        table = {i.name: evidence() for i in identities}
        with running_apiserver(Path(tmp), ADDRESS_HOST) as server:
            admin = core_api(server)
            seed(admin, args.nodes, changed)
            gate_times, baseline_times = [], []
            calls: dict[str, int] = {}
            audited: dict[str, int] = {}
            base_audited: dict[str, int] = {}
            for round_no in range(args.rounds):
                unadmit(admin, changed)
                took, calls, audited = gate_round(server, identities, table)
                gate_times.append(took)
                if round_no == 0:  # 2,000 requests: once is enough for a reference
                    unadmit(admin, changed)
                    took, base_audited = baseline_round(server, identities)
                    baseline_times.append(took)
            newer = {i.name: evidence(NEXT_RUN, NEXT_MEASURED) for i in identities}
            new_s, new_calls, new_audited = gate_round(server, identities, newer)
    gate_s, base_s = statistics.median(gate_times), statistics.median(baseline_times)
    per_node = sum(calls.values()) / args.nodes
    print(f"gate reconcile, {args.nodes} Nodes, {len(changed)} needing a change "
          f"(median of {args.rounds}): {gate_s:.2f} s")
    print(f"  API calls (client): {calls}; per node {per_node:.3f}")
    print(f"  API calls (API server audit log): {audited}")
    print(f"baseline (read + patch each Node, one round): {base_s:.2f} s, audit {base_audited}")
    print(f"a newer run (every Node records it): {new_s:.2f} s, API calls {new_calls}, audit "
          f"{new_audited}")
    print(f"ratio: the gate takes {gate_s / base_s:.3f} of the baseline's time "
          f"({base_s / gate_s:.1f}x faster)")
    ok = (gate_s < 5.0 and calls == {"list": 1, "patch": len(changed)}
          and audited.get("list") == 1 and audited.get("patch") == len(changed))
    print(f"goal (< 5 s, exactly 1 list + 1 patch per changed Node): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
