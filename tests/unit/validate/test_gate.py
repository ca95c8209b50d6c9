"""validate/gate.py against a real kube-apiserver (tests/kube_helpers.py) over HTTPS, with the
official client: one list and one guarded patch per changed Node (counted in the server's audit
log), a real 409 from a concurrent writer retried, dry run, and the failures (unreachable API,
refused credentials, a certificate that does not verify, a Node that never joined) as exit
codes.

The command's runs are real runs on disk (gate_runs.py beside it: every check judged on real
captures, written by the report code), then aged, narrowed, cut or damaged: a stale, a
partial-checks, a NaN and an empty run never admit a node, each with its code; a hardware
fault quarantines a node through a clean run until an operator releases it."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from lab.kube.local import kubeconfig, make_ca
from tests.kube_helpers import LocalApiServer, core_api, loopback_address, running_apiserver
from tests.unit.validate import gate_runs
from validate import cli
from validate.evidence import by_node, read_run
from validate.gate import KubeNodeApi, decision_for, reconcile
from validate.inventory import load
from validate.labels import NodeEvidence, NodeIdentity, NodeResults, plan_node
from validate.model import ExitCode, Status

P = "gpu.example.com.node-restriction.kubernetes.io"
TAINT = {"key": f"{P}/validation", "value": "pending", "effect": "NoSchedule"}
RUN = "20261202T101500Z"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("gate"), 14) as server:
        yield server


def identity(name: str) -> NodeIdentity:
    return NodeIdentity(name=name, pool="pool_h100_sxm", profile="h100-sxm5-80gb-8x",
                        gpu_pool={"accelerator": "h100-80gb", "topology": "8gpu-sxm-nvlink",
                                  "fabric": "infiniband", "workload": "batch",
                                  "sharing": "full-gpu"},
                        gpu_count=8, gpu_model="NVIDIA H100 80GB HBM3", gpu_memory_mib=81559,
                        nvswitch=True, nvlinks_per_gpu=18)


def passed(codes: tuple[str, ...] = ()) -> NodeEvidence:
    found = NodeResults(RUN, Status.FAIL if codes else Status.PASS, codes, 8, 81559,
                        Status.PASS, "NVIDIA H100 80GB HBM3")
    return NodeEvidence(RUN, NOW.isoformat(), found)


def register(cluster: LocalApiServer, *names: str) -> None:
    api = core_api(cluster)
    for name in names:
        api.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                         "spec": {"taints": [TAINT]}})


def patches(cluster: LocalApiServer, names: set[str]) -> list[str]:
    return [e["objectRef"]["name"] for e in cluster.audit()
            if e["verb"] == "patch" and e.get("objectRef", {}).get("name") in names]


def node_state(cluster: LocalApiServer, name: str) -> tuple[dict[str, str], dict[str, str],
                                                      list[tuple[str, str, str]], str]:
    node = core_api(cluster).read_node(name)
    # The gate's taints only: the API server's TaintNodesByCondition admission adds
    # node.kubernetes.io/not-ready to every new Node, and no node lifecycle controller runs
    # here to lift it (no kubelet reports Ready). It is not the gate's to touch.
    taints = [(t.key, t.value, t.effect) for t in node.spec.taints or []
              if t.key.startswith(P)]
    return (dict(node.metadata.labels or {}), dict(node.metadata.annotations or {}), taints,
            node.metadata.resource_version)


def test_one_list_and_one_patch_per_changed_node(cluster: LocalApiServer) -> None:
    names = ("a1", "a2", "a3")
    register(cluster, *names)
    api = KubeNodeApi(cluster.kubeconfig)
    evidence = {"a1": passed(), "a2": passed(("gpu.ecc.uncorrectable",)), "a3": passed()}
    report = reconcile(api, [identity(n) for n in names], evidence, P)
    assert dict(api.calls) == {"list": 1, "patch": 3}
    assert [(o.node, o.verdict, o.patched) for o in report.nodes] == [
        ("a1", "passed", True), ("a2", "failed", True), ("a3", "passed", True)]
    assert report.exit_code == ExitCode.CHECK_FAILED
    nodes = {n.metadata.name: n for n in core_api(cluster).list_node().items}
    # Only the gate's own taint went; the API server's not-ready taint (TaintNodesByCondition
    # admission, lifted by the node lifecycle controller once a kubelet reports Ready) stays.
    assert [(t.key, t.effect) for t in nodes["a1"].spec.taints] == [
        ("node.kubernetes.io/not-ready", "NoSchedule")]
    assert nodes["a1"].metadata.labels[f"{P}/validation"] == "passed"
    assert nodes["a1"].metadata.labels["team"] == "ml"  # not ours: untouched
    assert [(t.key, t.value, t.effect) for t in nodes["a2"].spec.taints] == [
        ("node.kubernetes.io/not-ready", None, "NoSchedule"),
        (TAINT["key"], "failed", "NoSchedule")]
    assert nodes["a2"].metadata.annotations == {f"{P}/failed-checks": "gpu.ecc.uncorrectable",
                                                f"{P}/last-run-time": NOW.isoformat()}
    # Again: every Node is right, so one list and nothing else.
    again_api = KubeNodeApi(cluster.kubeconfig)
    again = reconcile(again_api, [identity(n) for n in names], evidence, P)
    assert dict(again_api.calls) == {"list": 1}
    assert all(not o.changes and not o.patched for o in again.nodes)
    assert "nothing to change" in again.summary()
    assert patches(cluster, set(names)) == ["a1", "a2", "a3"]


class RacingApi(KubeNodeApi):
    """Writes to the Node (a real request, as a kubelet heartbeat or another controller would)
    between the gate's read and its patch, once per Node: the server answers 409."""

    def __init__(self, kubeconfig: Path, other: Any) -> None:
        super().__init__(kubeconfig)
        self.other = other
        self.raced: set[str] = set()

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        if name not in self.raced:
            self.raced.add(name)
            self.other.patch_node(name, {"metadata": {"labels": {"team": "racing"}}},
                                  _content_type="application/merge-patch+json")
        return super().patch_node(name, patch)


def test_a_conflict_is_read_again_and_retried(cluster: LocalApiServer) -> None:
    register(cluster, "r1")
    api = RacingApi(cluster.kubeconfig, core_api(cluster))
    report = reconcile(api, [identity("r1")], {"r1": passed()}, P)
    outcome = report.nodes[0]
    assert (outcome.verdict, outcome.patched, outcome.attempts) == ("passed", True, 2)
    assert dict(api.calls) == {"list": 1, "patch": 2, "get": 1}
    codes = [e["responseStatus"]["code"] for e in cluster.audit()
             if e["verb"] == "patch" and e.get("objectRef", {}).get("name") == "r1"
             and e["userAgent"].startswith("OpenAPI")]
    assert 409 in codes and codes[-1] == 200
    node = core_api(cluster).read_node("r1")
    assert node.metadata.labels["team"] == "racing"  # the other writer's change survived
    assert node.metadata.labels[f"{P}/validation"] == "passed"


def test_dry_run_changes_nothing(cluster: LocalApiServer) -> None:
    register(cluster, "d1")
    before = core_api(cluster).read_node("d1")
    api = KubeNodeApi(cluster.kubeconfig)
    report = reconcile(api, [identity("d1")], {"d1": passed()}, P, dry_run=True)
    assert dict(api.calls) == {"list": 1}
    assert report.nodes[0].changes and not report.nodes[0].patched
    after = core_api(cluster).read_node("d1")
    assert after.metadata.resource_version == before.metadata.resource_version


# -- the command, on real runs ----------------------------------------------------------------
def gate(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["gate", *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def copy_run(run: Path, to: Path) -> Path:
    """A copy of a run directory under ``to`` (a reports root of its own), without what an
    earlier gate wrote into it."""
    to.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, to / run.name, ignore=shutil.ignore_patterns("gate.json")))


# Hosts of the module's inventory (names with h100 get the H100 captures). Each test gates its
# own with --limit: the API server's Nodes live as long as the module.
BAD_RUNS = ("stale", "narrow", "cut", "nan", "inf", "empty")
HOSTS = (*(f"{case}-{mode}-h100" for case in BAD_RUNS for mode in ("dry", "real")),
         "c1-h100", "c2-h100", "c3-h100", "held-h100", "q-h100", "k8s-name-h100", "esc-h100")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, cluster: LocalApiServer,
         fixtures_dir: Path) -> dict[str, Path]:
    """The module's inventory and its runs: ``fresh`` (complete, an hour old, c2 with an Xid
    48 and q with an Xid 79) and ``before`` (the same, two hours old)."""
    root = tmp_path_factory.mktemp("site")
    inv = gate_runs.write_inventory(root / "inventory", HOSTS, prefix=P,
                                    kubeconfig=cluster.kubeconfig,
                                    host_vars={"k8s-name-h100": {
                                        "node_join_node_name": "renamed-node"}})
    faults = {"c2-h100": "xid-48", "q-h100": "xid-79"}
    before = gate_runs.write_run(fixtures_dir, inv, root / "reports", "r-before",
                                 NOW - timedelta(hours=2), faults=faults)
    fresh = gate_runs.write_run(fixtures_dir, inv, root / "reports", "r-fresh",
                                NOW - timedelta(hours=1), faults={"c2-h100": "xid-48"})
    return {"inventory": inv, "fresh": fresh, "before": before, "root": root}


def _bad_run(case: str, site: dict[str, Path], fixtures_dir: Path, where: Path,
             host: str) -> Path:
    """The fresh run gone wrong as ``case`` says."""
    if case == "narrow":  # validate run --checks 'gpu.*': a run of fewer checks
        return gate_runs.write_run(fixtures_dir, site["inventory"], where, "r-narrow",
                                   NOW - timedelta(hours=1), checks="gpu.*", limit=host)
    run = copy_run(site["fresh"], where)
    if case == "stale":
        gate_runs.age(run, timedelta(days=3))
    elif case == "cut":  # the results file ends after gpu.xid (run.json lists every check)
        gate_runs.cut_after(run, "gpu.xid")
    elif case == "nan":
        gate_runs.set_value(run, "gpu.count", "gpu_count", float("nan"))
    elif case == "inf":
        gate_runs.set_value(run, "storage.fio", "seq_read_mibps", float("inf"))
    elif case == "empty":
        gate_runs.empty(run)
    return run


EXPECTED = {  # case -> (exit code, what the gate names)
    "stale": (ExitCode.CHECK_FAILED, "gate.stale_run"),
    "narrow": (ExitCode.CHECK_FAILED, "gate.incomplete_run"),
    "cut": (ExitCode.CHECK_FAILED, "gate.incomplete_run"),
    "nan": (ExitCode.USAGE_OR_TOOL_ERROR, "gate.non_finite_value"),
    "inf": (ExitCode.USAGE_OR_TOOL_ERROR, "gate.non_finite_value"),
    "empty": (ExitCode.USAGE_OR_TOOL_ERROR, "gate.empty_run"),
}


@pytest.mark.parametrize("mode", ["dry", "real"])
@pytest.mark.parametrize("case", BAD_RUNS)
def test_evidence_the_gate_does_not_accept_never_admits_a_node(
        case: str, mode: str, cluster: LocalApiServer, site: dict[str, Path], fixtures_dir: Path,
        tmp_path: Path) -> None:
    host = f"{case}-{mode}-h100"
    register(cluster, host)
    before = node_state(cluster, host)
    run = _bad_run(case, site, fixtures_dir, tmp_path / "reports", host)
    dry = ["--dry-run"] if mode == "dry" else []
    args = ("-i", str(site["inventory"]), "--limit", host, "--run", str(run), *dry)
    code, out, err = gate(*args)
    want_code, want_words = EXPECTED[case]
    assert code == want_code, (out, err)
    assert want_words in out + err
    assert "Traceback" not in err and "internal error" not in err
    if case == "empty":
        assert out == "" and "nothing was changed" in err
    else:
        assert f"{host}: held ({want_words}); left as it is" in out.splitlines(), out
    assert node_state(cluster, host) == before  # not admitted, not touched at all
    assert patches(cluster, {host}) == []
    assert (run / "gate.json").exists() == (mode == "real" and case != "empty")
    # The same node on the run as it was written: admitted (or, dry, it would be).
    code, out, _ = gate("-i", str(site["inventory"]), "--limit", host, "--run",
                        str(site["fresh"]), *dry)
    assert code == ExitCode.OK, out
    assert f"{host}: passed; {'would change' if dry else 'patched in 1 attempt(s)'}" in out
    labels, _, taints, _ = node_state(cluster, host)
    assert (labels.get(f"{P}/validation"), taints) == (
        (None, [(TAINT["key"], "pending", "NoSchedule")]) if dry else ("passed", []))


def test_evidence_that_cannot_admit_leaves_an_admitted_node_as_it_is(
        cluster: LocalApiServer, site: dict[str, Path], fixtures_dir: Path, tmp_path: Path) -> None:
    host = "held-h100"
    register(cluster, host)
    inv = str(site["inventory"])
    assert gate("-i", inv, "--limit", host, "--run", str(site["fresh"]))[0] == ExitCode.OK
    admitted = node_state(cluster, host)
    for case in ("stale", "cut", "nan"):
        run = _bad_run(case, site, fixtures_dir, tmp_path / case, host)
        code, out, _ = gate("-i", inv, "--limit", host, "--run", str(run))
        assert code == EXPECTED[case][0] and f"{host}: held ({EXPECTED[case][1]})" in out
        assert node_state(cluster, host) == admitted
    # An older run than the one that judged it never judges it again.
    code, out, _ = gate("-i", inv, "--limit", host, "--run", str(site["before"]))
    assert code == ExitCode.CHECK_FAILED
    assert f"{host}: held (gate.superseded_run); left as it is" in out
    assert "older evidence never overrides newer" in out
    assert node_state(cluster, host) == admitted


def test_the_gate_command_reports_and_records_every_change(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    register(cluster, "c1-h100", "c2-h100")  # c3 never joined
    run = copy_run(site["fresh"], tmp_path / "reports")
    inv = gate_runs.write_inventory(tmp_path / "inv", ["c1-h100", "c2-h100", "c3-h100",
                                                       "c4-h100"], prefix=P,
                                    kubeconfig=cluster.kubeconfig)
    code, out, err = gate("-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED, err
    assert f"API {cluster.url}" in err and "run r-fresh (3 of 4 nodes in it)" in err
    lines = out.splitlines()
    assert "c1-h100: passed; patched in 1 attempt(s)" in lines
    assert f"  taint {P}/validation: pending:NoSchedule -> <none>" in lines
    assert "c2-h100: failed (gpu.xid.48); patched in 1 attempt(s)" in lines
    assert f"  taint {P}/validation: pending:NoSchedule -> failed:NoSchedule" in lines
    assert f"  annotation {P}/failed-checks: <none> -> gpu.xid.48" in lines
    assert "c3-h100: not-registered (gate.not_registered)" in lines
    assert "c4-h100: held (gate.node_not_in_run); left as it is" in lines
    assert any(line.startswith("gate: patched 2, already right 0;") for line in lines)
    record = json.loads((run / "gate.json").read_text())
    assert record["prefix"] == P and record["calls"] == {"list": 1, "patch": 2}
    recorded = {n["node"]: n for n in record["nodes"]}
    assert {"kind": "label", "key": f"{P}/validation", "old": None, "new": "failed"} in \
        recorded["c2-h100"]["changes"]
    # The gate's log, in the reports root: one line for this gate run.
    (logged,) = [json.loads(x) for x in (run.parent / "gate.log").read_text().splitlines()]
    assert (logged["event"], logged["run"], logged["exit_code"]) == ("gate", "r-fresh", 1)
    assert {n["node"]: n["verdict"] for n in logged["nodes"]} == {
        "c1-h100": "passed", "c2-h100": "failed", "c3-h100": "not-registered",
        "c4-h100": "held"}
    # Nothing left to do: the gate says so.
    code, out, _ = gate("-i", str(inv), "--run", str(run), "--limit", "c1-h100,c2-h100")
    assert code == ExitCode.CHECK_FAILED  # c2 still failed
    assert "c1-h100: passed; already right" in out and "nothing to change" in out
    # What drift asks: the gate's own decision for an inventory node against its Node finds
    # nothing to change on the Nodes the gate just reconciled.
    rows = by_node(read_run(run).rows)
    api = KubeNodeApi(cluster.kubeconfig)
    for node in load(inv, "c1-h100,c2-h100"):
        wanted = decision_for(node, rows[node.name], "r-fresh", api.get_node(node.name), P)
        assert wanted.verdict == ("failed" if node.name == "c2-h100" else "passed")
        assert plan_node(api.get_node(node.name), wanted, P).changes == ()


def test_a_hardware_fault_keeps_the_node_out_through_a_clean_run_until_released(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    host = "q-h100"
    register(cluster, host)
    inv = str(site["inventory"])
    log = tmp_path / "gate.log"
    # The run two hours ago found Xid 79 (fallen off the bus): quarantined.
    code, out, _ = gate("-i", inv, "--limit", host, "--run", str(site["before"]),
                        "--log", str(log))
    assert code == ExitCode.CHECK_FAILED
    assert f"{host}: quarantined (gate.quarantined, gpu.xid.79); patched in 1 attempt(s)" in out
    labels, notes, taints, _ = node_state(cluster, host)
    assert labels[f"{P}/validation"] == "quarantined"
    assert json.loads(notes[f"{P}/quarantine"]) == {
        "codes": ["gpu.xid.79"], "run": "r-before",
        "since": (NOW - timedelta(hours=2)).isoformat()}
    # An hour later a clean, fresh, complete run: the node stays out.
    code, out, _ = gate("-i", inv, "--limit", host, "--run", str(site["fresh"]),
                        "--log", str(log))
    assert code == ExitCode.CHECK_FAILED
    assert f"{host}: quarantined (gate.quarantined, gpu.xid.79)" in out
    assert "until an operator releases it (validate gate --release q-h100" in out
    labels, notes, taints, _ = node_state(cluster, host)
    assert taints == [(TAINT["key"], "failed", "NoSchedule")]
    assert (labels[f"{P}/last-run"], labels.get(f"{P}/validated-at")) == ("r-fresh", None)
    # Releasing needs a reason, and only a quarantined node can be released.
    code, _, err = gate("-i", inv, "--release", host, "--log", str(log))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "--release needs --reason" in err
    code, _, err = gate("-i", inv, "--release", host, "--reason", "  ", "--log", str(log))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "--reason is empty" in err
    code, out, _ = gate("-i", inv, "--release", host, "--reason", "x", "--dry-run")
    assert code == ExitCode.OK and "would release" in out
    assert f"{P}/quarantine" in node_state(cluster, host)[1]
    code, out, err = gate("-i", inv, "--release", host, "--reason",
                          "GPU at db:00 reseated, ticket OPS-1", "--log", str(log))
    assert code == ExitCode.OK, err
    assert f"{host}: released from quarantine (gpu.xid.79; run r-before) by " in out
    labels, notes, taints, _ = node_state(cluster, host)
    assert f"{P}/quarantine" not in notes
    released = json.loads(notes[f"{P}/released"])
    assert released["reason"] == "GPU at db:00 reseated, ticket OPS-1"
    assert released["codes"] == ["gpu.xid.79"] and "@" in released["by"]
    assert taints == [(TAINT["key"], "failed", "NoSchedule")]  # still out until a run admits
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["gate", "gate", "release"]
    assert events[2]["reason"] == released["reason"] and events[2]["node"] == host
    code, _, err = gate("-i", inv, "--release", host, "--reason", "again", "--log", str(log))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "is not quarantined" in err
    # The clean run admits it now; the release stays on record.
    code, out, _ = gate("-i", inv, "--limit", host, "--run", str(site["fresh"]),
                        "--log", str(log))
    assert code == ExitCode.OK and f"{host}: passed; patched in 1 attempt(s)" in out
    labels, notes, taints, _ = node_state(cluster, host)
    assert taints == [] and labels[f"{P}/validated-at"] == "r-fresh"
    assert json.loads(notes[f"{P}/released"]) == released


# ESC [2J clears the screen, ESC [H homes the cursor, BEL rings, ESC ] 0 ; ... BEL sets the
# window title: with a newline, what a hostile value needs to print a fake line of its own.
FAKE = "\x1b[2J\x1b[H\x07\ngate: patched 0, already right 9; passed 9"
SHOWN = "\\x1b[2J\\x1b[H\\x07\\ngate: patched 0, already right 9; passed 9"


def test_control_characters_from_the_operator_or_the_node_are_shown_not_obeyed(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    """A Node annotation someone wrote, a garbled quarantine record and a release reason carry
    terminal escapes and a newline: the gate prints them as visible escapes on the line they
    belong to, and stores the reason that way on the Node and in its log."""
    host = "esc-h100"
    register(cluster, host)
    core_api(cluster).patch_node(host, {"metadata": {"annotations": {f"{P}/note": "ok" + FAKE}}})
    inv, log = str(site["inventory"]), tmp_path / "gate.log"
    code, out, err = gate("-i", inv, "--limit", host, "--run", str(site["fresh"]),
                          "--log", str(log))
    assert code == ExitCode.OK, (out, err)
    assert f"  annotation {P}/note: ok{SHOWN} -> <none>" in out.splitlines(), out
    assert [ln for ln in out.splitlines() if ln.startswith("gate: patched")] == [
        "gate: patched 1, already right 0; passed 1, failed 0, quarantined 0, held 0, not "
        "registered 0, errors 0; API calls: 1 list, 1 patch"]
    record = json.dumps({"codes": ["gpu.xid.79\x1b]0;pwned\x07"], "run": "r\x1b[31m",
                         "since": NOW.isoformat()})
    core_api(cluster).patch_node(host, {"metadata": {"annotations": {
        f"{P}/quarantine": record}}})
    code, out, err = gate("-i", inv, "--release", host, "--reason", "GPU swapped" + FAKE,
                          "--log", str(log))
    assert code == ExitCode.OK, (out, err)
    assert (f"{host}: released from quarantine (gpu.xid.79\\x1b]0;pwned\\x07; run "
            "r\\x1b[31m) by ") in out, out
    # The reason's newline was already folded to a space (one line by design); the escapes
    # are kept, visibly, wherever it goes.
    reason = "GPU swapped\\x1b[2J\\x1b[H\\x07 gate: patched 0, already right 9; passed 9"
    assert out.splitlines()[0].endswith(f": {reason}")
    released = json.loads(node_state(cluster, host)[1][f"{P}/released"])
    assert released["reason"] == reason
    assert json.loads(log.read_text().splitlines()[-1])["reason"] == reason
    for text in (out, err, log.read_text()):
        assert not any(c in text for c in "\x1b\x07\r"), repr(text)


def test_the_failed_taint_effect_and_the_freshness_window_are_the_pools(
        cluster: LocalApiServer, site: dict[str, Path], fixtures_dir: Path, tmp_path: Path) -> None:
    register(cluster, "fx-h100")
    inv = gate_runs.write_inventory(tmp_path / "inv", ["fx-h100"], prefix=P,
                                    kubeconfig=cluster.kubeconfig,
                                    extra={"gpuready_gate_taint_effect": "NoExecute",
                                           "gpuready_gate_max_run_age": "30m"})
    run = gate_runs.write_run(fixtures_dir, inv, tmp_path / "reports", "fx-1",
                              NOW - timedelta(minutes=10), faults={"fx-h100": "xid-48"})
    code, out, _ = gate("-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED
    assert f"  taint {P}/validation: pending:NoSchedule -> failed:NoExecute" in out
    gate_runs.age(run, timedelta(minutes=25))  # 35 minutes old: past the pool's 30m
    code, out, _ = gate("-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED and "fx-h100: held (gate.stale_run)" in out
    assert "its pool admits on runs no older than 30 min (gpuready_gate_max_run_age)" in out
    for value, words in (("90", "not a duration with units"), ("0h", "longer than 0"),
                         ("soon", "not a duration")):
        bad = gate_runs.write_inventory(tmp_path / f"bad-{value}", ["fx-h100"], prefix=P,
                                        kubeconfig=cluster.kubeconfig,
                                        extra={"gpuready_gate_max_run_age": value})
        code, _, err = gate("-i", str(bad), "--run", str(run), "--dry-run")
        assert code == ExitCode.USAGE_OR_TOOL_ERROR
        assert (f"gpuready_gate_max_run_age (set in group pool_h100_sxm, host fx-h100) is "
                f"{value!r}") in err and words in err
    bad = gate_runs.write_inventory(tmp_path / "bad-effect", ["fx-h100"], prefix=P,
                                    kubeconfig=cluster.kubeconfig,
                                    extra={"gpuready_gate_taint_effect": "PreferNoSchedule"})
    code, _, err = gate("-i", str(bad), "--run", str(run), "--dry-run")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert "gpuready_gate_taint_effect" in err and "not one of NoSchedule, NoExecute" in err


# -- clear words ------------------------------------------------------------------------------
def test_a_broken_results_file_is_named_not_an_internal_error(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    inv = str(site["inventory"])
    no_node = copy_run(site["fresh"], tmp_path / "a")
    gate_runs.drop_column(no_node, "node")
    code, out, err = gate("-i", inv, "--limit", "c1-h100", "--run", str(no_node))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and out == ""
    assert f"{no_node / 'results.parquet'}: no column 'node'" in err
    assert "KeyError" not in err and "internal error" not in err
    bogus = copy_run(site["fresh"], tmp_path / "b")
    gate_runs.csv_only_with_status(bogus, 2, "bogus")
    code, _, err = gate("-i", inv, "--limit", "c1-h100", "--run", str(bogus))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"{bogus / 'results.csv'}: line 4 (node c1-h100, check gpu.count): status 'bogus' "
            "is not a status (one of") in err, err
    assert "nan is not a valid Status" not in err
    code, _, err = gate("-i", inv, "--run", str(tmp_path / "no-such-run"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "holds no validation results" in err


def test_a_wrong_ca_says_the_certificate_did_not_verify(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    register(cluster, "c3-h100")
    before = node_state(cluster, "c3-h100")
    # Another cluster's CA (the real kubeadm's): a real TLS handshake fails verification.
    wrong = tmp_path / "wrong-ca.conf"
    wrong.write_text(kubeconfig(cluster.url, make_ca(tmp_path / "other-pki").read_bytes(),
                                cluster.token))
    code, out, err = gate("-i", str(site["inventory"]), "--limit", "c3-h100", "--run",
                          str(site["fresh"]), "--kubeconfig", str(wrong))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and out == ""
    assert (f"the API server at {cluster.url} answered, but its certificate did not verify "
            "against the kubeconfig's certificate authority: ") in err
    assert "cannot reach the Kubernetes API" not in err and "nothing was changed" in err
    assert node_state(cluster, "c3-h100") == before


def test_an_unreachable_or_refusing_api_exits_2_and_changes_nothing(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    register(cluster, "u1-h100")
    before = core_api(cluster).read_node("u1-h100").metadata.resource_version
    text = cluster.kubeconfig.read_text()
    unreachable = tmp_path / "unreachable.conf"
    unreachable.write_text(text.replace(cluster.address, loopback_address(15)))
    refused = tmp_path / "refused.conf"
    refused.write_text(text.replace(cluster.token, "x" * 48))
    run = copy_run(site["fresh"], tmp_path / "reports")
    for config, words in ((unreachable, "cannot reach the Kubernetes API"),
                          (refused, "GET /api/v1/nodes: the API server at "
                                    f"{cluster.url} did not accept the kubeconfig's "
                                    "credentials (401 Unauthorized")):
        inv = gate_runs.write_inventory(tmp_path / config.stem, ["u1-h100"], prefix=P,
                                        kubeconfig=config)
        code, out, err = gate("-i", str(inv), "--run", str(run))
        assert code == ExitCode.USAGE_OR_TOOL_ERROR
        assert words in err and "nothing was changed" in err
        assert not (run / "gate.json").exists()
        assert out == ""
    assert core_api(cluster).read_node("u1-h100").metadata.resource_version == before


@pytest.mark.parametrize("prefix", ["kubernetes.io", "node.kubernetes.io", "k8s.io",
                                    "x.k8s.io"])
def test_a_reserved_prefix_is_refused(cluster: LocalApiServer, site: dict[str, Path],
                                      tmp_path: Path, prefix: str) -> None:
    reserved = "k8s.io" if prefix.endswith("k8s.io") else "kubernetes.io"
    code, _, err = gate("-i", str(site["inventory"]), "--limit", "c1-h100", "--run",
                        str(site["fresh"]), "--prefix", prefix, "--dry-run")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert f"label prefix {prefix!r} is under {reserved}, which Kubernetes reserves" in err
    inv = gate_runs.write_inventory(tmp_path / "inv", ["c1-h100"], prefix=prefix,
                                    kubeconfig=cluster.kubeconfig)
    code, _, err = gate("-i", str(inv), "--run", str(site["fresh"]), "--dry-run")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert (f"gpuready_label_prefix (set in group pool_h100_sxm, host c1-h100) is {prefix!r}: "
            f"it is under {reserved}, which Kubernetes reserves") in err


def test_bad_input_is_a_clear_error(site: dict[str, Path]) -> None:
    code, _, err = gate("-i", str(site["inventory"]), "--run", str(site["fresh"]), "--prefix",
                        "A_B")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "not a DNS subdomain" in err
    code, _, err = gate("-i", str(site["inventory"]), "--run", str(site["fresh"]), "--reason",
                        "why")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "--reason goes with --release" in err
    code, _, err = gate("-i", str(site["inventory"]), "--release", "c1-h100", "--reason", "x",
                        "--limit", "c1-h100")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "--limit does not apply" in err
    code, _, err = gate("-i", str(site["inventory"]), "--release", "nobody", "--reason", "x")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "nobody is not a GPU node of" in err


def test_a_renamed_node_is_found_and_a_bad_declaration_stops_before_any_patch(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    register(cluster, "renamed-node")
    # A host that names a profile that does not exist is the inventory's error: the gate
    # refuses before it touches any Node, naming the variable and where it was set.
    bad = gate_runs.write_inventory(tmp_path / "bad", ["k8s-name-h100", "c1-h100"], prefix=P,
                                    kubeconfig=cluster.kubeconfig, host_vars={
                                        "k8s-name-h100": {"node_join_node_name": "renamed-node"},
                                        "c1-h100": {"gpu_profile": "no-such-profile"}})
    code, out, err = gate("-i", str(bad), "--run", str(site["fresh"]))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, err
    assert "gpu_profile (set on host c1-h100)" in err and "no-such-profile" in err
    labels = core_api(cluster).read_node("renamed-node").metadata.labels or {}
    assert f"{P}/validation" not in labels
    code, out, err = gate("-i", str(site["inventory"]), "--limit", "k8s-name-h100", "--run",
                          str(site["fresh"]))
    assert code == ExitCode.OK, err
    assert "renamed-node: passed; patched in 1 attempt(s)" in out
    node = core_api(cluster).read_node("renamed-node")
    assert node.metadata.labels[f"{P}/validation"] == "passed"


def test_a_node_name_that_is_no_kubernetes_name_is_refused_before_the_api(
        cluster: LocalApiServer, site: dict[str, Path], tmp_path: Path) -> None:
    """node_join_node_name '../nodes/x' would go into /api/v1/nodes/<name>: refused as the
    inventory is read, naming the variable and where it was set; the API is not asked."""
    bad = gate_runs.write_inventory(tmp_path / "bad", ["c1-h100"], prefix=P,
                                    kubeconfig=cluster.kubeconfig,
                                    host_vars={"c1-h100": {"node_join_node_name": "../nodes/x"}})
    asked = len(cluster.audit())
    for argv in (("--run", str(site["fresh"])), ("--release", "c1-h100", "--reason", "fixed")):
        code, out, err = gate("-i", str(bad), *argv)
        assert (code, out) == (ExitCode.USAGE_OR_TOOL_ERROR, ""), err
        assert ("node_join_node_name (set on host c1-h100) is '../nodes/x', not a Kubernetes "
                "Node name (an RFC 1123 subdomain") in err, err
        assert "nothing was changed" in err
    assert len(cluster.audit()) == asked
