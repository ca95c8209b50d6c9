"""Drift's labels layer against the API server stand-in over HTTPS (tests/apiserver_helpers.py),
read with the official client as the gate reads it, and judged by the gate's own decision:

- after the real gate (`validate gate`) has labelled the nodes, drift finds nothing; a label
  edited by hand, a taint removed by hand and a Node that is gone are reported with what the
  gate would set, and a label the gate does not own is not;
- drift writes nothing to any Node (the audit log has no write from it);
- an API that cannot be reached, or no kubeconfig at all, is said on the console and makes the
  run incomplete (exit 2); deselected with --layers, the same run exits 0 and says nothing;
- the run judged is each node's newest validation run, never a drift run.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.apiserver_helpers import StandIn, core_api, running_standin, standin_address
from validate import cli
from validate.drift.labels import latest_results
from validate.model import CheckResult, ExitCode, Status
from validate.report import write_report

P = "gpu.example.com"
TAINT = f"{P}/validation"
POOL = "pool_l40s_pcie"
PROFILE = "l40s-pcie-48gb-4x"
GPU_POOL = {"accelerator": "l40s-48gb", "topology": "4gpu-pcie", "fabric": "ethernet",
            "workload": "inference", "sharing": "time-slicing"}
PENDING = {"key": TAINT, "value": "pending", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    with running_standin(tmp_path_factory.mktemp("drift-labels"), 16) as standin:
        yield standin


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _inventory(tmp: Path, hosts: list[str], kubeconfig: Path | None) -> Path:
    root = tmp / "inventory"
    (root / "group_vars").mkdir(parents=True)
    # Never connected to: the labels layer asks the API server, not the nodes.
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "children": {POOL: {"hosts": {h: {"ansible_host": "192.0.2.1"} for h in hosts}}}}}}}))
    settings = {"gpu_profile": PROFILE, "gpuready_label_prefix": P, "gpu_pool": GPU_POOL}
    if kubeconfig is not None:
        settings["gpuready_kubeconfig"] = str(kubeconfig)
    (root / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings))
    return root


def _validated(reports: Path, run_id: str, failing: dict[str, str]) -> Path:
    """A validation run's report, as `validate run` writes it, for these nodes."""
    rows = []
    for node in ("d1", "d2", "d3"):
        code = failing.get(node)
        rows += [
            CheckResult(run_id, "2026-12-02T10:15:00+00:00", node, POOL, PROFILE, "gpu.count",
                        "gpu_count", 4.0, "", None, 4.0, Status.PASS, "ok", "", 0.1),
            CheckResult(run_id, "2026-12-02T10:15:00+00:00", node, POOL, PROFILE, "gpu.ecc",
                        "uncorrectable_volatile", 2.0 if code else 0.0, "errors", None, 0.0,
                        Status.FAIL if code else Status.PASS, code or "ok", "", 0.1)]
    return write_report(rows, reports, run_id).run_dir


def _drift(inv: Path, reports: Path, *extra: str) -> tuple[int, str, str, pd.DataFrame]:
    code, out, err = _main("drift", "-i", str(inv), "--out", str(reports), *extra)
    run = Path(next(line[8:] for line in out.splitlines() if line.startswith("report: ")))
    return code, out, err, pd.read_parquet(run / "drift.parquet")


def _labels(table: pd.DataFrame) -> set[tuple[str, str, str, str, str]]:
    t = table[table["layer"] == "labels"]
    return set(zip(t["node"], t["item"], t["declared"], t["actual"], t["status"], strict=True))


def test_edited_label_removed_taint_and_missing_node_are_reported(cluster: StandIn,
                                                                 tmp_path: Path) -> None:
    api = core_api(cluster)
    for name in ("d1", "d2", "d3"):  # as kubeadm join registers them
        api.create_node({"metadata": {"name": name, "labels": {"team": "ml"}},
                         "spec": {"taints": [PENDING]}})
    inv = _inventory(tmp_path, ["d1", "d2", "d3"], cluster.kubeconfig)
    reports = tmp_path / "reports"
    run = _validated(reports, "20261202T101500Z", {"d2": "gpu.ecc.uncorrectable"})
    code, out, err = _main("gate", "-i", str(inv), "--run", str(run))
    assert code == ExitCode.CHECK_FAILED, out + err  # d2 failed: kept out
    code, out, err, table = _drift(inv, reports, "--layers", "labels")
    assert code == ExitCode.OK, out + err
    assert table.empty
    # By hand: an edited label of ours on d1, one of someone else's, the taint the gate keeps
    # on the failed d2 removed, and d3's Node deleted.
    api.patch_node("d1", {"metadata": {"labels": {f"{P}/pool": "pool_h100_sxm",
                                                  "team": "infra"}}})
    api.patch_node("d2", {"spec": {"taints": []}})
    api.delete_node("d3")
    writes_before = _writes(cluster)
    code, out, err, table = _drift(inv, reports, "--layers", "labels")
    assert code == ExitCode.CHECK_FAILED, out + err
    assert _labels(table) == {
        ("d1", f"label {P}/pool", POOL, "pool_h100_sxm", "drift"),
        ("d2", f"taint {TAINT}", "pending:NoSchedule", "absent", "drift"),
        ("d3", "Node object", "registered", "absent", "drift"),
    }
    detail = table.set_index("node").loc["d2", "detail"]
    assert "the gate decides failed from run 20261202T101500Z (gpu.ecc.uncorrectable)" in detail
    assert f"DRIFT d1 labels label {P}/pool: declared {POOL}, actual pool_h100_sxm" in out
    assert _writes(cluster) == writes_before  # drift only read


def _writes(cluster: StandIn) -> int:
    return len([e for e in cluster.audit() if e["verb"] not in ("get", "list", "watch")])


def test_an_unavailable_api_makes_the_run_incomplete_unless_deselected(
        cluster: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reports = tmp_path / "reports"
    _validated(reports, "20261202T101500Z", {})
    dead = tmp_path / "dead.conf"
    dead.write_text(cluster.kubeconfig.read_text().replace(cluster.address,
                                                           standin_address(17)))
    code, out, err, table = _drift(_inventory(tmp_path / "a", ["d1"], dead), reports,
                                   "--layers", "labels")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, out + err
    assert "NOT COMPARED labels and taints: cannot reach the Kubernetes API at https://" \
        f"{standin_address(17)}:6443" in out
    assert "labels and taints: NOT COMPARED" in err
    assert list(table["status"]) == ["unavailable"]
    # No kubeconfig anywhere: the inventory names none, no KUBECONFIG, no ~/.kube/config.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    code, out, err, table = _drift(_inventory(tmp_path / "b", ["d1"], None), reports,
                                   "--layers", "labels")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR, out + err
    assert "NOT COMPARED labels and taints: cannot load the kubeconfig" in out
    # Deselected: not asked, not said, and the exit code is the other layers' alone.
    code, out, err, table = _drift(_inventory(tmp_path / "c", ["d1"], dead), reports,
                                   "--layers", "performance", "--perf-checks", "")
    assert (code, table.empty) == (ExitCode.OK, True), out + err
    assert "NOT COMPARED" not in out + err


def test_the_newest_validation_run_of_each_node_is_judged_never_a_drift_run(
        tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    _validated(reports, "20261201T000000Z", {"d1": "gpu.ecc.uncorrectable"})
    newer = _validated(reports, "20261202T000000Z", {})
    # A later run that validated only d2 (--limit), and a drift run with rows of d1.
    write_report([CheckResult("20261203T000000Z", "t", "d2", POOL, PROFILE, "gpu.count",
                              "gpu_count", 4.0, "", None, 4.0, Status.PASS, "ok", "", 0.1)],
                 reports, "20261203T000000Z")
    drift = reports / "20261204T000000Z-drift-0001"
    drift.mkdir()
    (drift / "drift.json").write_text("{}")
    write_report([CheckResult(drift.name, "t", "d1", POOL, PROFILE, "gpu.ecc",
                              "uncorrectable_volatile", 9.0, "", None, 0.0, Status.FAIL,
                              "gpu.ecc.uncorrectable", "", 0.1)], reports, drift.name,
                 run_dir=drift, update_latest=False)
    got = latest_results([reports], ["d1", "d2", "d3", "d9"])
    assert {n: r.run_id for n, r in got.items()} == {
        "d1": newer.name, "d2": "20261203T000000Z", "d3": newer.name}
    assert got["d1"].passed
