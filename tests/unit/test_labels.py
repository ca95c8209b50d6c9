"""validate/labels.py: what the gate would set on a node, judged on real Node objects
(tests/fixtures/k8s-api) and on the lab's pools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from validate.labels import (
    CODE_GFD,
    CODE_HARDWARE,
    IdentityError,
    NodeIdentity,
    NodeResults,
    check_prefix,
    desired_state,
    gfd_of,
    plan_node,
)
from validate.model import Status

P = "gpu.example.com.node-restriction.kubernetes.io"
H100 = NodeIdentity(
    name="gpu-h100-01", pool="pool_h100_sxm", profile="h100-sxm5-80gb-8x",
    gpu_pool={"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
              "fabric": "infiniband", "workload": "distributed-training",
              "sharing": "full-gpu"},
    gpu_count=8, gpu_model="NVIDIA H100 80GB HBM3", gpu_memory_mib=81559, nvswitch=True,
    nvlinks_per_gpu=18)
T4 = NodeIdentity(
    name="qa-mig-worker-gpu-1", pool="pool_t4", profile="t4-2x",
    gpu_pool={"accelerator": "t4-16gb", "topology": "2gpu-pcie", "fabric": "ethernet",
              "workload": "inference", "sharing": "time-slicing"},
    gpu_count=2, gpu_model="Tesla T4", gpu_memory_mib=15360, nvswitch=False,
    nvlinks_per_gpu=0)


def results(status: Status = Status.PASS, codes: tuple[str, ...] = (), count: int | None = 8,
            memory: int | None = 81559, model: Status | None = Status.PASS,
            detail: str = "NVIDIA H100 80GB HBM3",
            run_id: str = "20261202T101500Z") -> NodeResults:
    return NodeResults(run_id, status, codes, count, memory, model, detail)


def real_t4_node(fixtures_dir: Path) -> dict[str, Any]:
    text = (fixtures_dir / "k8s-api" / "node-yaml-kubectl-edit-tesla-t4-x2-gce-k8s1.23.yaml"
            ).read_text()
    node: dict[str, Any] = yaml.safe_load(text)  # kubectl edit's leading comments are YAML's
    return node


def real_a16_node(fixtures_dir: Path) -> dict[str, Any]:
    doc = json.loads((fixtures_dir / "k8s-api" / "kubectl-get-nodes-o-json-list-rke2-vgpu-"
                      "a16-4q-gpu-operator.json").read_text())
    node: dict[str, Any] = doc["items"][0]
    return node


def test_a_passing_node_gets_its_identity_and_loses_the_taint() -> None:
    desired = desired_state(H100, results(), P)
    assert desired.verdict == "passed" and not desired.tainted and desired.codes == ()
    assert desired.labels == {
        f"{P}/pool": "pool_h100_sxm", f"{P}/profile": "h100-sxm5-80gb-8x",
        f"{P}/accelerator": "h100-80gb", f"{P}/gpu-count": "8", f"{P}/gpu-memory-gib": "80",
        f"{P}/form-factor": "sxm", f"{P}/topology": "8gpu-sxm-nvlink", f"{P}/nvlink": "nvswitch",
        f"{P}/fabric": "infiniband", f"{P}/workload": "distributed-training",
        f"{P}/sharing": "full-gpu", f"{P}/validation": "passed",
        f"{P}/validated-at": "20261202T101500Z"}
    assert desired.annotations == {}
    node = {"metadata": {"name": H100.name, "resourceVersion": "41", "labels": {
        "kubernetes.io/hostname": H100.name}}, "spec": {"taints": [
            {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}
    plan = plan_node(node, desired, P)
    assert plan.patch is not None
    assert plan.patch["metadata"]["resourceVersion"] == "41"
    assert plan.patch["metadata"]["labels"] == desired.labels  # all new; others not named
    assert plan.patch["spec"]["taints"] == [{"key": "dedicated", "value": "gpu",
                                             "effect": "NoSchedule"}]
    assert [str(c) for c in plan.changes if c.kind == "taint"] == [
        f"taint {P}/validation: pending:NoSchedule -> <none>"]


def test_a_failing_node_keeps_the_taint_with_its_codes() -> None:
    failed = results(Status.FAIL, ("gpu.ecc.uncorrectable",))
    desired = desired_state(H100, failed, P)
    assert desired.verdict == "failed" and desired.tainted
    assert desired.labels[f"{P}/validation"] == "failed"
    assert desired.annotations == {f"{P}/failed-checks": "gpu.ecc.uncorrectable"}
    # Untainted (it passed an earlier run): the taint comes back, the verdict's time moves.
    before = desired_state(H100, results(run_id="20261101T000000Z"), P)
    node = {"metadata": {"name": H100.name, "resourceVersion": "7",
                         "labels": dict(before.labels)}}
    plan = plan_node(node, desired, P)
    assert plan.patch is not None
    assert plan.patch["spec"]["taints"] == [{"key": f"{P}/validation", "value": "pending",
                                             "effect": "NoSchedule"}]
    assert plan.patch["metadata"]["labels"] == {f"{P}/validation": "failed",
                                                f"{P}/validated-at": "20261202T101500Z"}


def test_a_node_already_right_needs_no_patch_and_keeps_its_validation_time() -> None:
    first = desired_state(H100, results(run_id="20261201T000000Z"), P)
    node = {"metadata": {"name": H100.name, "resourceVersion": "9",
                         "labels": {**first.labels, "team": "ml"}}}
    again = desired_state(H100, results(run_id="20261202T000000Z"), P)
    plan = plan_node(node, again, P)
    assert plan.patch is None and plan.changes == ()


def test_hand_edits_stale_and_foreign_labels(fixtures_dir: Path) -> None:
    node = real_t4_node(fixtures_dir)
    t4 = results(count=2, memory=15360, detail="Tesla T4")
    labels = node["metadata"]["labels"]
    desired = desired_state(T4, t4, P, gfd_of(labels))
    assert desired.verdict == "passed", desired.reasons  # the real GFD labels agree
    node["metadata"]["labels"] = {**labels, **desired.labels, f"{P}/gpu-count": "1",
                                  f"{P}/retired-label": "x"}
    del node["metadata"]["labels"][f"{P}/fabric"]
    plan = plan_node(node, desired, P)
    assert [str(c) for c in plan.changes] == [
        f"label {P}/fabric: <none> -> ethernet",
        f"label {P}/gpu-count: 1 -> 2",
        f"label {P}/retired-label: x -> <none>"]
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {f"{P}/fabric": "ethernet",
                                                f"{P}/gpu-count": "2",
                                                f"{P}/retired-label": None}
    # The real node's own labels (GFD, NFD, kubernetes.io) are never part of the patch.
    assert not any(k.startswith(("nvidia.com/", "feature.node", "kubernetes.io"))
                   for k in plan.patch["metadata"]["labels"])
    assert plan.patch["metadata"]["resourceVersion"] == node["metadata"]["resourceVersion"]
    assert "spec" not in plan.patch  # the real node has no taint of ours: nothing to do


def test_gfd_labels_that_contradict_the_hardware_fail(fixtures_dir: Path) -> None:
    # A real GPU Operator node (an A16 vGPU) against a pool of H100s whose run passed.
    gfd = gfd_of(real_a16_node(fixtures_dir)["metadata"]["labels"])
    assert gfd == {"nvidia.com/gpu.product": "NVIDIA-A16-4Q", "nvidia.com/gpu.count": "1",
                   "nvidia.com/gpu.memory": "4096"}
    desired = desired_state(H100, results(), P, gfd)
    assert desired.verdict == "failed" and desired.codes == (CODE_GFD,)
    assert desired.annotations == {f"{P}/failed-checks": CODE_GFD}
    assert any("nvidia.com/gpu.product=NVIDIA-A16-4Q" in r for r in desired.reasons)
    assert any("nvidia.com/gpu.count=1, the run counted 8" in r for r in desired.reasons)
    assert any("nvidia.com/gpu.memory=4096 MiB" in r for r in desired.reasons)


@pytest.mark.parametrize(("run", "reason"), [
    (results(Status.FAIL, ("gpu.count.missing",), count=7),
     "7 GPUs in a pool of 8-GPU nodes (pool_h100_sxm)"),
    (results(Status.FAIL, ("gpu.model.mismatch",), model=Status.FAIL,
             detail="expected NVIDIA H100 80GB HBM3: GPU0(00000000:18:00.0)=NVIDIA H100 PCIe"),
     "PCIe GPUs in an SXM pool (pool_h100_sxm)"),
    (results(Status.FAIL, ("gpu.model.mismatch",), model=Status.FAIL,
             detail="expected NVIDIA H100 80GB HBM3: GPU0(00000000:18:00.0)=NVIDIA A100-SXM4-80GB"),
     "GPU product is not the pool's NVIDIA H100 80GB HBM3"),
])
def test_hardware_that_contradicts_the_pool_fails_with_its_own_code(run: NodeResults,
                                                                    reason: str) -> None:
    desired = desired_state(H100, run, P)
    assert CODE_HARDWARE in desired.codes and desired.tainted
    assert any(reason in r for r in desired.reasons), desired.reasons
    # The run's own codes stay alongside.
    assert set(run.codes) <= set(desired.codes)
    assert desired.annotations[f"{P}/failed-checks"] == ",".join(sorted(desired.codes))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="not a DNS subdomain"):
        check_prefix("Gpu_Example.com")
    bad = NodeIdentity(**{**{f: getattr(H100, f) for f in H100.__dataclass_fields__},
                          "gpu_pool": {**H100.gpu_pool, "workload": "distributed training"}})
    with pytest.raises(IdentityError, match=r"gpu-h100-01: .*/workload 'distributed training'"):
        desired_state(bad, results(), P)
