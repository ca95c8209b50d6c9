"""validate/labels.py: what the gate decides for a node, judged on real Node objects
(tests/fixtures/k8s-api) and on the lab's pools: labels and taints from the evidence, evidence
that cannot admit, quarantine and its release, and the reserved label prefixes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from validate.labels import (
    CODE_GFD,
    CODE_HARDWARE,
    CODE_INCOMPLETE,
    CODE_NON_FINITE,
    CODE_NOT_IN_RUN,
    CODE_QUARANTINED,
    CODE_STALE,
    CODE_SUPERSEDED,
    Desired,
    EvidenceProblem,
    GatePolicy,
    IdentityError,
    NodeEvidence,
    NodeIdentity,
    NodeResults,
    NotQuarantined,
    check_prefix,
    decide,
    gfd_of,
    plan_node,
    release_patch,
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


POLICY = GatePolicy(P)
RUN = "20261202T101500Z"
AT = "2026-12-02T10:15:00+00:00"


def results(status: Status = Status.PASS, codes: tuple[str, ...] = (), count: int | None = 8,
            memory: int | None = 81559, model: Status | None = Status.PASS,
            detail: str = "NVIDIA H100 80GB HBM3", run_id: str = RUN) -> NodeResults:
    return NodeResults(run_id, status, codes, count, memory, model, detail)


def evidence(found: NodeResults | None = None, measured_at: str = AT,
             problems: tuple[EvidenceProblem, ...] = ()) -> NodeEvidence:
    found = found if found is not None else results()
    return NodeEvidence(found.run_id, measured_at, found, problems)


def desired_state(identity: NodeIdentity, found: NodeResults, prefix: str = P,
                  gfd: dict[str, str] | None = None, measured_at: str = AT) -> Desired:
    """The decision for a node whose Node carries only ``gfd`` (as the old tests asked it)."""
    node = {"metadata": {"name": identity.name, "labels": dict(gfd or {})}}
    return decide(identity, evidence(found, measured_at), node, GatePolicy(prefix))


def carrying(desired: Desired, name: str = H100.name, rv: str = "5") -> dict[str, Any]:
    """A Node that carries ``desired`` (as the gate leaves it)."""
    taints = ([{"key": f"{P}/validation", "value": desired.taint[0],
                "effect": desired.taint[1]}] if desired.taint else [])
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": dict(desired.labels),
                         "annotations": dict(desired.annotations)},
            "spec": {"taints": taints}}


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
        f"{P}/last-run": RUN, f"{P}/validated-at": RUN}
    assert desired.annotations == {f"{P}/last-run-time": AT}
    node = {"metadata": {"name": H100.name, "resourceVersion": "41", "labels": {
        "kubernetes.io/hostname": H100.name}}, "spec": {"taints": [
            {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}}
    plan = plan_node(node, decide(H100, evidence(), node, POLICY), P)
    assert plan.patch is not None
    assert plan.patch["metadata"]["resourceVersion"] == "41"
    assert plan.patch["metadata"]["labels"] == desired.labels  # all new; others not named
    assert plan.patch["spec"]["taints"] == [{"key": "dedicated", "value": "gpu",
                                             "effect": "NoSchedule"}]
    assert [str(c) for c in plan.changes if c.kind == "taint"] == [
        f"taint {P}/validation: pending:NoSchedule -> <none>"]


def test_a_failing_node_is_tainted_failed_and_shows_both_runs() -> None:
    # It passed an earlier run and carries that; the new run finds an uncorrectable error.
    before = desired_state(H100, results(run_id="20261101T000000Z"),
                           measured_at="2026-11-01T00:00:00+00:00")
    node = carrying(before, rv="7")
    failed = results(Status.FAIL, ("gpu.ecc.uncorrectable",))
    desired = decide(H100, evidence(failed), node, POLICY)
    assert desired.verdict == "failed" and desired.taint == ("failed", "NoSchedule")
    assert desired.labels[f"{P}/validation"] == "failed"
    # The run that judged it, and the last one that admitted it, side by side.
    assert desired.labels[f"{P}/last-run"] == RUN
    assert desired.labels[f"{P}/validated-at"] == "20261101T000000Z"
    assert desired.annotations == {f"{P}/failed-checks": "gpu.ecc.uncorrectable",
                                   f"{P}/last-run-time": AT}
    plan = plan_node(node, desired, P)
    assert plan.patch is not None
    assert plan.patch["spec"]["taints"] == [{"key": f"{P}/validation", "value": "failed",
                                             "effect": "NoSchedule"}]
    assert plan.patch["metadata"]["labels"] == {f"{P}/validation": "failed",
                                                f"{P}/last-run": RUN}
    # The join's pending taint becomes the failed one; a pool may choose NoExecute.
    joined = {"metadata": {"name": H100.name}, "spec": {"taints": [
        {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"}]}}
    evicting = decide(H100, evidence(failed), joined, GatePolicy(P, "NoExecute"))
    changes = [str(c) for c in plan_node(joined, evicting, P).changes if c.kind == "taint"]
    assert changes == [f"taint {P}/validation: pending:NoSchedule -> failed:NoExecute"]
    assert "validated-at" not in " ".join(evicting.labels)  # it never passed


def test_a_node_already_right_needs_no_patch_and_a_new_run_is_recorded() -> None:
    first = desired_state(H100, results())
    node = carrying(first)
    node["metadata"]["labels"]["team"] = "ml"
    again = decide(H100, evidence(), node, POLICY)  # the same run gated again
    assert plan_node(node, again, P).patch is None and plan_node(node, again, P).changes == ()
    later = results(run_id="20261203T101500Z")
    newer = decide(H100, evidence(later, "2026-12-03T10:15:00+00:00"), node, POLICY)
    plan = plan_node(node, newer, P)
    assert plan.patch is not None
    assert plan.patch["metadata"]["labels"] == {f"{P}/last-run": "20261203T101500Z",
                                                f"{P}/validated-at": "20261203T101500Z"}
    assert plan.patch["metadata"]["annotations"] == {
        f"{P}/last-run-time": "2026-12-03T10:15:00+00:00"}


def test_the_gate_keeps_a_rolling_upgrade_s_state() -> None:
    """In a roll the gate admits the node between ``validating`` and ``done``: its patch must
    leave the state, or a roll stopped there would find an admitted node still cordoned with no
    state, and never uncordon it."""
    node = carrying(desired_state(H100, results()))
    state = {f"{P}/upgrade-state": "validating",
             f"{P}/upgrade-detail": "2026-12-03T10:14:00+00:00"}
    node["metadata"]["annotations"].update(state)
    node["spec"] = {"unschedulable": True, "taints": [
        {"key": f"{P}/validation", "value": "upgrading", "effect": "NoSchedule"}]}
    later = results(run_id="20261203T101500Z")
    for found in (later, results(Status.FAIL, ("gpu.ecc.uncorrectable",),
                                 run_id="20261203T101500Z")):
        decided = decide(H100, evidence(found, "2026-12-03T10:15:00+00:00"), node, POLICY)
        plan = plan_node(node, decided, P)
        assert plan.patch is not None
        assert not set(plan.patch["metadata"].get("annotations", {})) & set(state), plan.patch
        assert {k: decided.annotations[k] for k in state} == state


def test_hand_edits_stale_and_foreign_labels(fixtures_dir: Path) -> None:
    node = real_t4_node(fixtures_dir)
    t4 = results(count=2, memory=15360, detail="Tesla T4")
    labels = node["metadata"]["labels"]
    desired = desired_state(T4, t4, P, gfd_of(labels))
    assert desired.verdict == "passed", desired.reasons  # the real GFD labels agree
    node["metadata"]["labels"] = {**labels, **desired.labels, f"{P}/gpu-count": "1",
                                  f"{P}/retired-label": "x"}
    node["metadata"]["annotations"] = {**node["metadata"].get("annotations", {}),
                                       **desired.annotations}
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
    assert desired.annotations == {f"{P}/failed-checks": CODE_GFD, f"{P}/last-run-time": AT}
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


@pytest.mark.parametrize("prefix", ["kubernetes.io", "k8s.io", "node.kubernetes.io",
                                    "gpu.example.com.kubernetes.io", "x.k8s.io",
                                    "node-role.kubernetes.io"])
def test_prefixes_kubernetes_reserves_are_refused(prefix: str) -> None:
    reserved = "k8s.io" if prefix.endswith("k8s.io") else "kubernetes.io"
    with pytest.raises(ValueError, match=rf"label prefix '{prefix}' is under {reserved}, which "
                                         "Kubernetes reserves"):
        check_prefix(prefix)


@pytest.mark.parametrize("prefix", [P, "node-restriction.kubernetes.io", "gpu.example.com",
                                    "kubernetes.io.example.com", "notk8s.io"])
def test_a_site_domain_or_node_restriction_is_a_prefix(prefix: str) -> None:
    assert check_prefix(prefix) == prefix


# -- evidence the gate does not admit on ------------------------------------------------------
def _problem(code: str) -> EvidenceProblem:
    return EvidenceProblem(code, f"because of {code}")


JOINED = {"metadata": {"name": H100.name, "resourceVersion": "3", "labels": {"team": "ml"}},
          "spec": {"taints": [{"key": f"{P}/validation", "value": "pending",
                               "effect": "NoSchedule"}]}}


@pytest.mark.parametrize("code", [CODE_STALE, CODE_INCOMPLETE, CODE_NON_FINITE])
def test_a_passing_node_on_evidence_that_cannot_admit_is_left_as_it_is(code: str) -> None:
    admitted = carrying(desired_state(H100, results(run_id="20261101T000000Z"),
                                      measured_at="2026-11-01T00:00:00+00:00"))
    for node in (JOINED, admitted):
        desired = decide(H100, evidence(problems=(_problem(code),)), node, POLICY)
        assert (desired.verdict, desired.codes, desired.reasons) == (
            "held", (code,), (f"because of {code}",))
        plan = plan_node(node, desired, P)
        assert plan.patch is None and plan.changes == ()
    # What a held node is said to carry is what it has (drift compares against it).
    held = decide(H100, evidence(problems=(_problem(code),)), JOINED, POLICY)
    assert held.taint == ("pending", "NoSchedule") and held.labels == {}


@pytest.mark.parametrize("code", [CODE_INCOMPLETE, CODE_NON_FINITE])
def test_incomplete_evidence_of_a_fault_still_keeps_the_node_out(code: str) -> None:
    failed = results(Status.FAIL, ("gpu.ecc.uncorrectable",))
    desired = decide(H100, evidence(failed, problems=(_problem(code),)), JOINED, POLICY)
    assert desired.verdict == "failed" and desired.taint == ("failed", "NoSchedule")
    assert desired.codes == tuple(sorted(("gpu.ecc.uncorrectable", code)))


def test_stale_evidence_or_a_run_without_the_node_judges_nothing() -> None:
    failed = results(Status.FAIL, ("gpu.ecc.uncorrectable",))
    admitted = carrying(desired_state(H100, results()))
    stale = decide(H100, evidence(failed, problems=(_problem(CODE_STALE),)), admitted, POLICY)
    assert stale.verdict == "held" and plan_node(admitted, stale, P).patch is None
    absent = NodeEvidence(RUN, None, None, (_problem(CODE_NOT_IN_RUN),))
    assert decide(H100, absent, JOINED, POLICY).codes == (CODE_NOT_IN_RUN,)
    assert decide(H100, absent, None, POLICY).verdict == "held"


def test_older_evidence_never_overrides_what_a_newer_run_decided() -> None:
    # A run measured at 10:15 failed the node; a run measured at 09:00 that passed it is
    # gated after it (two pipelines, or an old run by mistake): it judges nothing.
    failed = results(Status.FAIL, ("gpu.ecc.uncorrectable",))
    node = carrying(desired_state(H100, failed))
    older = results(run_id="20261202T090000Z")
    desired = decide(H100, evidence(older, "2026-12-02T09:00:00+00:00"), node, POLICY)
    assert (desired.verdict, desired.codes) == ("held", (CODE_SUPERSEDED,))
    assert "before run 20261202T101500Z (2026-12-02T10:15:00+00:00)" in desired.reasons[0]
    # The same run gated again is not "older": it judges as before.
    assert decide(H100, evidence(failed), node, POLICY).verdict == "failed"


# -- quarantine -------------------------------------------------------------------------------
def test_a_hardware_fault_quarantines_until_an_operator_releases_the_node() -> None:
    fault = results(Status.FAIL, ("gpu.count.missing", "gpu.xid.79"), count=7)
    out = decide(H100, evidence(fault), JOINED, POLICY)
    assert out.verdict == "quarantined" and out.taint == ("failed", "NoSchedule")
    assert out.labels[f"{P}/validation"] == "quarantined"
    assert json.loads(out.annotations[f"{P}/quarantine"]) == {
        "codes": ["gpu.count.missing", "gpu.xid.79"], "run": RUN, "since": AT}
    assert CODE_QUARANTINED in out.codes
    node = carrying(out)
    # A clean run later: still out, still quarantined, the record unchanged.
    clean = results(run_id="20261203T000000Z")
    later = "2026-12-03T00:00:00+00:00"
    still = decide(H100, evidence(clean, later), node, POLICY)
    assert still.verdict == "quarantined" and still.taint == ("failed", "NoSchedule")
    assert still.annotations[f"{P}/quarantine"] == out.annotations[f"{P}/quarantine"]
    assert any("until an operator releases it (validate gate --release gpu-h100-01" in r
               for r in still.reasons)
    node = carrying(still, rv="6")
    # The release: who, when, why on the Node; the taint stays until a run admits the node.
    patch, record = release_patch(node, P, by="alice@ops1", at="2026-12-03T01:00:00+00:00",
                                  reason="GPU 7 reseated, ticket OPS-1")
    assert patch == {"metadata": {
        "resourceVersion": "6",
        "labels": {f"{P}/validation": "failed"},
        "annotations": {f"{P}/quarantine": None,
                        f"{P}/released": json.dumps(record, sort_keys=True),
                        # out, no longer quarantined: what the gate writes after the release
                        f"{P}/failed-checks": "gpu.count.missing,gpu.xid.79"}}}
    assert record == {"by": "alice@ops1", "at": "2026-12-03T01:00:00+00:00",
                      "reason": "GPU 7 reseated, ticket OPS-1",
                      "codes": ["gpu.count.missing", "gpu.xid.79"], "run": RUN, "since": AT}
    released = json.loads(json.dumps(node))
    released["metadata"]["labels"][f"{P}/validation"] = "failed"
    del released["metadata"]["annotations"][f"{P}/quarantine"]
    released["metadata"]["annotations"][f"{P}/released"] = json.dumps(record, sort_keys=True)
    admitted = decide(H100, evidence(clean, later), released, POLICY)
    assert admitted.verdict == "passed" and admitted.taint is None
    assert admitted.annotations[f"{P}/released"] == json.dumps(record, sort_keys=True)
    with pytest.raises(NotQuarantined, match="gpu-h100-01 is not quarantined"):
        release_patch(carrying(admitted), P, by="x", at="t", reason="r")


def _apply(node: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch of labels and annotations, as the API server applies it."""
    out = json.loads(json.dumps(node))
    for part in ("labels", "annotations"):
        for key, value in (patch["metadata"].get(part) or {}).items():
            if value is None:
                out["metadata"][part].pop(key, None)
            else:
                out["metadata"][part][key] = value
    return out


def test_a_release_covers_the_run_it_was_given_for_not_a_later_one() -> None:
    """Gated again on the run that quarantined it, a released node fails with its codes but
    is not quarantined again, and the decision is what the release left on the Node (nothing
    to change: drift finds nothing). A run measured after the release that finds a hardware
    fault quarantines it again."""
    fault = results(Status.FAIL, ("gpu.xid.79",))
    quarantined = carrying(decide(H100, evidence(fault), JOINED, POLICY))
    at = "2026-12-02T12:00:00+00:00"
    patch, record = release_patch(quarantined, P, by="alice@ops1", at=at,
                                  reason="GPU 3 reseated, ticket OPS-2")
    released = _apply(quarantined, patch)
    again = decide(H100, evidence(fault), released, POLICY)
    assert (again.verdict, again.taint) == ("failed", ("failed", "NoSchedule"))
    assert again.codes == ("gpu.xid.79",) and f"{P}/quarantine" not in again.annotations
    assert again.released is not None and again.released.by == "alice@ops1"
    assert str(again.released) == (
        "released by alice@ops1 at 2026-12-02T12:00:00+00:00: GPU 3 reseated, ticket OPS-2 "
        f"(lifted the quarantine for gpu.xid.79 found by run {RUN})")
    assert any("measured before the release: released by alice@ops1" in r
               for r in again.reasons)
    assert plan_node(released, again, P).changes == ()
    # A later run (after the release) with the fault again: quarantined again.
    later = results(Status.FAIL, ("gpu.xid.79",), run_id="20261202T130000Z")
    relapse = decide(H100, evidence(later, "2026-12-02T13:00:00+00:00"), released, POLICY)
    assert relapse.verdict == "quarantined" and relapse.released is None
    assert json.loads(relapse.annotations[f"{P}/quarantine"])["run"] == "20261202T130000Z"
    assert relapse.annotations[f"{P}/released"] == json.dumps(record, sort_keys=True)
    # A later clean run admits it; the release is history, not part of the decision.
    clean = results(run_id="20261202T130000Z")
    admitted = decide(H100, evidence(clean, "2026-12-02T13:00:00+00:00"), released, POLICY)
    assert (admitted.verdict, admitted.released) == ("passed", None)


def test_other_failures_clear_on_the_next_pass() -> None:
    node = carrying(desired_state(H100, results(Status.FAIL, ("gpu.ecc.uncorrectable",
                                                              "gpu.xid.48"))))
    clean = decide(H100, evidence(results(run_id="20261203T000000Z"),
                                  "2026-12-03T00:00:00+00:00"), node, POLICY)
    assert clean.verdict == "passed" and clean.taint is None
    assert f"{P}/quarantine" not in clean.annotations
