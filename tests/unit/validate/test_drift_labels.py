"""Drift's labels layer against a real kube-apiserver (tests/kube_helpers.py) over HTTPS, read with
the official client as the gate reads it, and judged by the gate's own decision
(validate.gate.decision_for) on real validation runs on disk (gate_runs.py beside it: every
check judged on real captures):

- after the real gate (`validate gate`) has labelled the nodes, drift finds nothing; a label
  edited by hand, a failed taint removed by hand and a Node that is gone are reported with what
  the gate would set, and a label the gate does not own is not; drift writes nothing to any
  Node (the audit log has no write from it);
- the gate's rules hold in drift because it is the gate's decision: a quarantine annotation
  removed by hand is drift on a clean run (only a release lifts it), and the failed taint's
  effect is the pool's (NoExecute);
- after `gate --release`, the released node is judged as the gate judges it after the release
  (out, not quarantined again, on the run that quarantined it): no drift, exit 0, and a note
  on the node's line with who released it, when and why;
- evidence the gate would not act on (a stale run, a run of fewer checks, a run older than
  the one that last judged the Node) is NOT COMPARED for that node, with the gate's code and
  what to do, and makes the run incomplete (exit 2): a hand edit there is not called "no drift";
- an API that cannot be reached, or no kubeconfig at all, is said on the console and makes the
  run incomplete (exit 2); deselected with --layers, the same run exits 0 and says nothing;
- the run judged is each node's newest validation run, never a drift run.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import closed_port
from tests.kube_helpers import LocalApiServer, core_api, loopback_address, running_apiserver
from tests.unit.validate import gate_runs
from validate import cli
from validate.drift.labels import latest_rows
from validate.model import CheckResult, ExitCode, Status
from validate.report import write_report

P = "gpu.example.com"
TAINT = f"{P}/validation"
PENDING = {"key": TAINT, "value": "pending", "effect": "NoSchedule"}
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("drift-labels"), 16) as server:
        yield server


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _register(cluster: LocalApiServer, *names: str) -> None:
    api = core_api(cluster)
    for name in names:  # as kubeadm join registers them
        api.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                         "spec": {"taints": [PENDING]}})


def _drift(inv: Path, reports: Path, *extra: str) -> tuple[int, str, str, pd.DataFrame]:
    code, out, err = _main("drift", "-i", str(inv), "--out", str(reports), "--layers", "labels",
                           *extra)
    run = Path(next(line[8:] for line in out.splitlines() if line.startswith("report: ")))
    return code, out, err, pd.read_parquet(run / "drift.parquet")


def _labels(table: pd.DataFrame) -> set[tuple[str, str, str, str, str]]:
    t = table[table["layer"] == "labels"]
    return set(zip(t["node"], t["item"], t["declared"], t["actual"], t["status"], strict=True))


def _writes(cluster: LocalApiServer) -> int:
    return len([e for e in cluster.audit() if e["verb"] not in ("get", "list", "watch")])


def test_edited_label_removed_taint_and_missing_node_are_reported(
        cluster: LocalApiServer, tmp_path: Path, fixtures_dir: Path) -> None:
    hosts = ["d1-h100", "d2-h100", "d3-h100"]
    _register(cluster, *hosts)
    inv = gate_runs.write_inventory(tmp_path / "inventory", hosts, prefix=P,
                                    kubeconfig=cluster.kubeconfig)
    reports = tmp_path / "reports"
    run = gate_runs.write_run(fixtures_dir, inv, reports, "r1", NOW - timedelta(hours=1),
                              faults={"d2-h100": "xid-48"})
    code, out, err = _main("gate", "-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED, out + err  # d2 failed: kept out
    code, out, err, table = _drift(inv, reports)
    assert code == ExitCode.OK, out + err
    assert table.empty
    # By hand: an edited label of ours on d1, one of someone else's, the taint the gate keeps
    # on the failed d2 removed, and d3's Node deleted.
    api = core_api(cluster)
    api.patch_node("d1-h100", {"metadata": {"labels": {f"{P}/pool": "pool_a100_sxm",
                                                       "team": "infra"}}})
    api.patch_node("d2-h100", {"spec": {"taints": []}})
    api.delete_node("d3-h100")
    writes_before = _writes(cluster)
    code, out, err, table = _drift(inv, reports)
    assert code == ExitCode.CHECK_FAILED, out + err
    assert _labels(table) == {
        ("d1-h100", f"label {P}/pool", "pool_h100_sxm", "pool_a100_sxm", "drift"),
        ("d2-h100", f"taint {TAINT}", "failed:NoSchedule", "absent", "drift"),
        ("d3-h100", "Node object", "registered", "absent", "drift"),
    }
    detail = table.set_index("node").loc["d2-h100", "detail"]
    assert detail.startswith("the gate decides failed from run r1 (gpu.xid"), detail
    assert (f"DRIFT d1-h100 labels label {P}/pool: declared pool_h100_sxm, actual "
            "pool_a100_sxm") in out
    assert "NOT COMPARED" not in out + err
    assert _writes(cluster) == writes_before  # drift only read


def test_quarantine_and_the_pools_taint_effect_hold_in_drift(
        cluster: LocalApiServer, tmp_path: Path, fixtures_dir: Path) -> None:
    """Drift compares with the gate's own decision, so its policy comes along: a quarantined
    node stays quarantined on a clean run (a copy of the old rules would call the gate's
    labels drift), and the failed taint carries the pool's effect."""
    hosts = ["q1-h100", "x1-h100"]
    _register(cluster, *hosts)
    inv = gate_runs.write_inventory(tmp_path / "inventory", hosts, prefix=P,
                                    kubeconfig=cluster.kubeconfig,
                                    extra={"gpuready_gate_taint_effect": "NoExecute"})
    reports = tmp_path / "reports"
    faulty = gate_runs.write_run(fixtures_dir, inv, reports, "r1", NOW - timedelta(hours=2),
                                 faults={"q1-h100": "xid-79", "x1-h100": "xid-48"})
    assert _main("gate", "-i", str(inv), "--run", str(faulty))[0] == ExitCode.CHECK_FAILED
    clean = gate_runs.write_run(fixtures_dir, inv, reports, "r2", NOW - timedelta(hours=1),
                                limit="q1-h100")
    code, out, _ = _main("gate", "-i", str(inv), "--limit", "q1-h100", "--run", str(clean))
    assert code == ExitCode.CHECK_FAILED and "q1-h100: quarantined" in out, out
    code, out, err, table = _drift(inv, reports)
    assert (code, table.empty) == (ExitCode.OK, True), out + err
    # By hand: the quarantined node labelled passed, the failed taint made NoSchedule.
    api = core_api(cluster)
    api.patch_node("q1-h100", {"metadata": {"labels": {f"{P}/validation": "passed"}}})
    api.patch_node("x1-h100", {"spec": {"taints": [
        {"key": TAINT, "value": "failed", "effect": "NoSchedule"}]}})
    code, out, err, table = _drift(inv, reports)
    assert code == ExitCode.CHECK_FAILED, out + err
    assert _labels(table) == {
        ("q1-h100", f"label {P}/validation", "quarantined", "passed", "drift"),
        ("x1-h100", f"taint {TAINT}", "failed:NoExecute", "failed:NoSchedule", "drift")}
    details = table.set_index("node")["detail"]
    assert details["q1-h100"].startswith("the gate decides quarantined from run r2"), details
    assert details["x1-h100"].startswith("the gate decides failed from run r1"), details


def test_a_released_node_is_judged_as_the_gate_judges_it_after_the_release(
        cluster: LocalApiServer, tmp_path: Path, fixtures_dir: Path) -> None:
    """Issue 41: after `gate --release`, drift judged the node on the run that quarantined it
    as if there had been no release ("declared quarantined, actual failed", exit 1). The gate
    after the release keeps the node out, not quarantined, until a run admits it; drift says
    the same (exit 0 for its labels) and shows the release on the node's line."""
    host = "rel1-h100"
    _register(cluster, host)
    inv = gate_runs.write_inventory(tmp_path / "inventory", [host], prefix=P,
                                    kubeconfig=cluster.kubeconfig)
    reports = tmp_path / "reports"
    run = gate_runs.write_run(fixtures_dir, inv, reports, "r1", NOW - timedelta(hours=1),
                              faults={host: "xid-79"})
    code, out, _ = _main("gate", "-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED and f"{host}: quarantined" in out, out
    reason = "GPU 3 reseated, ticket OPS-3"
    code, out, err = _main("gate", "-i", str(inv), "--release", host, "--reason", reason,
                           "--log", str(tmp_path / "gate.log"))
    assert code == ExitCode.OK, out + err
    code, out, err, table = _drift(inv, reports)
    assert code == ExitCode.OK, out + err
    assert "DRIFT" not in out
    (note,) = table.itertuples(index=False)
    assert (note.node, note.layer, note.item, note.status) == (host, "labels", "release",
                                                               "note")
    assert note.actual.startswith("released by ") and "@" in note.actual
    assert note.detail == (f"{reason} (quarantine for gpu.xid.79 found by run r1 lifted; the "
                           "gate judges run r1, measured before the release, as failed: out "
                           "until a run admits it)")
    assert f"NOTE {host} labels release: {note.actual}; {reason} (quarantine" in out
    # The gate itself, on the same run again, agrees: failed, not quarantined again.
    writes = _writes(cluster)
    code, out, _ = _main("gate", "-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED and f"{host}: failed" in out, out
    assert _writes(cluster) == writes  # nothing to change on the Node
    labels = core_api(cluster).read_node(host).metadata.labels
    assert labels[f"{P}/validation"] == "failed"
    # A hand edit of the released node is still drift, said with the release.
    core_api(cluster).patch_node(host, {"metadata": {"labels": {f"{P}/validation": "passed"}}})
    code, out, err, table = _drift(inv, reports)
    assert code == ExitCode.CHECK_FAILED, out + err
    assert (host, f"label {P}/validation", "failed", "passed", "drift") in _labels(table)
    drifted = table[table["status"] == "drift"].iloc[0]
    assert drifted["detail"].startswith("the gate decides failed from run r1 (gpu.xid.79), "
                                        "after the release by "), drifted["detail"]


def _copy_run(run: Path, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, root / run.name))


def test_evidence_the_gate_would_not_act_on_is_not_compared(
        cluster: LocalApiServer, tmp_path: Path, fixtures_dir: Path) -> None:
    """A run too old for the pool's window, a run of fewer checks, and a run older than the
    one that last judged the Node: the gate would leave the Node as it is (held), so comparing
    it with that decision would always find nothing. Drift says it did not compare, why (the
    gate's code and words) and what to do, and the run is incomplete (exit 2), even with a
    hand edit on the Node that a fresh run would show as drift."""
    host = "h1-h100"
    _register(cluster, host)
    inv = gate_runs.write_inventory(tmp_path / "inventory", [host], prefix=P,
                                    kubeconfig=cluster.kubeconfig)
    older = gate_runs.write_run(fixtures_dir, inv, tmp_path / "all", "r-older",
                                NOW - timedelta(hours=3))
    fresh = gate_runs.write_run(fixtures_dir, inv, tmp_path / "all", "r-fresh",
                                NOW - timedelta(hours=1))
    assert _main("gate", "-i", str(inv), "--run", str(fresh))[0] == ExitCode.OK
    core_api(cluster).patch_node(host, {"metadata": {"labels": {f"{P}/gpu-count": "4"}}})
    stale = _copy_run(fresh, tmp_path / "stale")
    gate_runs.age(stale, timedelta(days=3))
    narrow = gate_runs.write_run(fixtures_dir, inv, tmp_path / "narrow", "r-narrow",
                                 NOW - timedelta(minutes=30), checks="gpu.*")
    superseded = _copy_run(older, tmp_path / "superseded")
    cases: dict[str, tuple[Path, str, str]] = {
        "gate.stale_run": (stale, "validate the node again", "its pool admits on runs no "
                           "older than 24 h"),
        "gate.incomplete_run": (narrow, "without --checks", "a run of fewer checks can keep "
                                "a node out, never admit it"),
        "gate.superseded_run": (superseded, "point --history at the reports the gate reads",
                                "older evidence never overrides newer"),
    }
    for code_name, (run, hint, gate_words) in cases.items():
        writes_before = _writes(cluster)
        code, out, err, table = _drift(inv, tmp_path / f"out-{code_name}",
                                       "--history", str(run.parent))
        assert code == ExitCode.USAGE_OR_TOOL_ERROR, (code_name, out, err)
        rows: list[dict[str, Any]] = table.to_dict("records")
        assert [(r["node"], r["item"], r["actual"], r["status"]) for r in rows] == [
            (host, "labels and taints", f"not compared: held ({code_name})", "unavailable")]
        detail = rows[0]["detail"]
        assert detail.startswith(f"the gate would leave the Node as it is on run {run.name} "
                                 f"(held: {code_name}): "), detail
        assert gate_words in detail and hint in detail, detail
        assert f"NOT COMPARED {host} labels: {detail}" in out.splitlines()
        assert "DRIFT" not in out  # the hand edit is not judged against a held decision
        assert _writes(cluster) == writes_before
    # The same node on the fresh run: the hand edit is drift.
    code, out, err, table = _drift(inv, tmp_path / "out-fresh", "--history", str(fresh.parent))
    assert code == ExitCode.CHECK_FAILED, out + err
    assert _labels(table) == {(host, f"label {P}/gpu-count", "8", "4", "drift")}


def test_an_unavailable_api_makes_the_run_incomplete_unless_deselected(
        cluster: LocalApiServer, tmp_path: Path, fixtures_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    dead = tmp_path / "dead.conf"
    dead.write_text(cluster.kubeconfig.read_text().replace(cluster.address,
                                                           loopback_address(17)))
    inv_dead = gate_runs.write_inventory(tmp_path / "a", ["u1-h100"], prefix=P, kubeconfig=dead)
    reports = tmp_path / "reports"
    gate_runs.write_run(fixtures_dir, inv_dead, reports, "r1", NOW - timedelta(hours=1))
    code, out, err, table = _drift(inv_dead, reports)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, out + err
    assert "NOT COMPARED labels and taints: cannot reach the Kubernetes API at https://" \
        f"{loopback_address(17)}:6443" in out
    assert "labels and taints: NOT COMPARED" in err
    assert list(table["status"]) == ["unavailable"]
    # No kubeconfig anywhere: the inventory names none, no KUBECONFIG, no ~/.kube/config.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    inv_none = gate_runs.write_inventory(tmp_path / "b", ["u1-h100"], prefix=P, kubeconfig=dead)
    pool_vars = next((inv_none / "group_vars").glob("*.yml"))
    pool_vars.write_text("\n".join(line for line in pool_vars.read_text().splitlines()
                                   if not line.startswith("gpuready_kubeconfig:")) + "\n")
    code, out, err, table = _drift(inv_none, reports)
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, out + err
    assert "NOT COMPARED labels and taints: cannot load the kubeconfig" in out
    # Deselected: not asked, not said, and the exit code is the other layers' alone (here the
    # versions layer's: the node refuses the connection). A drift that compares no layer at
    # all (--layers performance --perf-checks '') is a usage error, not the exit 0 it was.
    inv_refusing = gate_runs.write_inventory(
        tmp_path / "c", ["u1-h100"], prefix=P, kubeconfig=dead,
        host_vars={"u1-h100": {"ansible_host": "127.0.0.1", "ansible_port": closed_port()}})
    code, out, err = _main("drift", "-i", str(inv_refusing), "--out", str(reports), "--layers",
                           "versions", "--accept-unknown-host-keys")
    assert code == ExitCode.UNREACHABLE, out + err
    assert "NOT COMPARED" not in out + err and "labels" not in out + err


def test_the_newest_validation_run_of_each_node_is_judged_never_a_drift_run(
        tmp_path: Path) -> None:
    pool, profile = gate_runs.POOL, "h100-sxm5-80gb-8x"

    def row(run_id: str, node: str, status: Status = Status.PASS) -> CheckResult:
        return CheckResult(run_id, "2026-12-02T10:15:00+00:00", node, pool, profile,
                           "gpu.ecc", "uncorrectable_volatile",
                           9.0 if status is Status.FAIL else 0.0, "errors", None, 0.0, status,
                           "gpu.ecc.uncorrectable" if status is Status.FAIL else "ok", "", 0.1)

    reports = tmp_path / "reports"
    write_report([row("20261201T000000Z", n, Status.FAIL if n == "d1" else Status.PASS)
                  for n in ("d1", "d2", "d3")], reports, "20261201T000000Z")
    write_report([row("20261202T000000Z", n) for n in ("d1", "d2", "d3")], reports,
                 "20261202T000000Z")
    # A later run that validated only d2 (--limit), and a drift run with rows of d1.
    write_report([row("20261203T000000Z", "d2")], reports, "20261203T000000Z")
    drift = reports / "20261204T000000Z-drift-0001"
    drift.mkdir()
    (drift / "drift.json").write_text("{}")
    write_report([row(drift.name, "d1", Status.FAIL)], reports, drift.name, run_dir=drift,
                 update_latest=False)
    got = latest_rows([reports], ["d1", "d2", "d3", "d9"])
    assert {n: run_id for n, (run_id, _) in got.items()} == {
        "d1": "20261202T000000Z", "d2": "20261203T000000Z", "d3": "20261202T000000Z"}
    assert list(got["d1"][1]["status"].astype(str)) == ["pass"]
