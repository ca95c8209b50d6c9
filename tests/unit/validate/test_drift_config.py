"""The configuration layer's event reader on real ansible-runner events of a check-mode run
(tests/fixtures/drift-lab: six converged lab hosts, five with a drift case injected)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from validate.drift.config import HIDDEN, EventReader, is_secret, render_diff
from validate.drift.model import FindingStatus, Layer

POOLS = {f"node{i}": "pool_l40s_pcie" for i in range(1, 7)}
EVENTS = "ansible-runner-2.4.3-check-diff-events-6-nodes.jsonl"


@pytest.fixture(scope="module")
def events(fixtures_dir: Path) -> list[dict[str, Any]]:
    lines = (fixtures_dir / "drift-lab" / EVENTS).read_text().splitlines()
    return [json.loads(line) for line in lines]


def _items(reader_findings: list[Any], node: str) -> set[tuple[str, str]]:
    return {(f.layer.value, f.item) for f in reader_findings if f.node == node}


def test_each_host_shows_its_case_and_nothing_else(events: list[dict[str, Any]]) -> None:
    result = EventReader(POOLS).feed(events)
    f = result.findings
    assert _items(f, "node1") == {("configuration", "/etc/containerd/conf.d/99-nvidia.toml")}
    assert _items(f, "node2") == {("versions", "hold nvidia-driver-550")}
    assert _items(f, "node3") == {("configuration", "/etc/sysctl.d/90-gpuready.conf")}
    assert _items(f, "node4") == {("runtime", "service nvidia-persistenced.service")}
    # The downgraded driver: apt released the holds; the versions come from apt's task.
    assert _items(f, "node5") == {("versions", f"hold {p}") for p in (
        "nvidia-driver-550", "nvidia-dkms-550", "nvidia-utils-550", "nvidia-compute-utils-550")}
    assert _items(f, "node6") == set()
    # Handlers (containerd restart after the drop-in, reboot marker after the driver) are
    # consequences and are not findings.
    assert all("Restart" not in x.source and "reboot" not in x.item for x in f)
    assert {x.status for x in f} == {FindingStatus.DRIFT}


def test_file_diff_and_values(events: list[dict[str, Any]]) -> None:
    f = {(x.node, x.item): x for x in EventReader(POOLS).feed(events).findings}
    dropin = f[("node1", "/etc/containerd/conf.d/99-nvidia.toml")]
    first = dropin.detail.splitlines()[0]
    assert first == "--- /etc/containerd/conf.d/99-nvidia.toml (on the node)"
    assert "-        SystemdCgroup = false" in dropin.detail
    assert "+        SystemdCgroup = true" in dropin.detail
    assert "nvidia_container_toolkit" in dropin.source
    service = f[("node4", "service nvidia-persistenced.service")]
    assert "started" in service.declared and "ActiveState=inactive" in service.actual
    hold = f[("node2", "hold nvidia-driver-550")]
    assert (hold.declared, hold.actual) == ("hold", "install")


def test_declared_packages_come_from_the_apt_tasks(events: list[dict[str, Any]]) -> None:
    result = EventReader(POOLS).feed(events)
    tasks = {t.task: t for t in result.package_tasks["node5"]}
    drv = tasks["Install the pinned NVIDIA driver packages"]
    assert drv.changed and drv.packages["nvidia-utils-550"] == "550.90.07-0ubuntu1"
    assert "550.54.15" in drv.summary  # apt's simulation names what it would change
    assert tasks["Remove the fabric manager"].packages == {"nvidia-fabricmanager-550": None}
    assert tasks["Install containerd"].packages == {"containerd": ""}
    assert not any(t.changed for t in result.package_tasks["node6"])


def test_no_log_and_secret_paths_hide_the_diff(events: list[dict[str, Any]]) -> None:
    ev = next(e for e in events if e["event_data"]["host"] == "node3"
              and e["event_data"]["res"].get("changed"))
    secret = json.loads(json.dumps(ev))
    secret["event_data"]["res"]["invocation"]["module_args"]["dest"] = "/etc/kubernetes/pki/ca.key"
    hidden = EventReader(POOLS).feed([secret]).findings[0]
    assert hidden.detail == HIDDEN and "vm.swappiness" not in hidden.detail
    censored = json.loads(json.dumps(ev))
    censored["event_data"]["res"] = {
        "censored": "the output has been hidden due to the fact that 'no_log: true' was "
                    "specified for this result", "changed": True}
    f = EventReader(POOLS).feed([censored]).findings[0]
    assert "no_log" in f.detail and "vm.swappiness" not in f.detail + f.actual
    assert is_secret("/etc/kubernetes/kubelet.conf", ("*/kubelet.conf",))


def test_failed_assert_and_unreachable(events: list[dict[str, Any]]) -> None:
    ok = next(e for e in events if e["event_data"]["host"] == "node6"
              and e["event_data"]["resolved_action"] == "ansible.builtin.assert")
    failed = json.loads(json.dumps(ok))
    failed["event"] = "runner_on_failed"
    failed["event_data"]["res"] = {"failed": True, "msg": "the role says no"}
    gone = json.loads(json.dumps(ok))
    gone["event"] = "runner_on_unreachable"
    gone["event_data"]["host"] = "node5"
    gone["event_data"]["res"] = {"unreachable": True, "msg": "ssh: connect timed out"}
    result = EventReader(POOLS).feed([failed, gone])
    by_node = {f.node: f for f in result.findings}
    assert by_node["node6"].status is FindingStatus.DRIFT
    assert "later tasks and roles not compared" in by_node["node6"].detail
    assert by_node["node6"].layer is not None and "node6" in result.stopped
    assert (by_node["node5"].status, by_node["node5"].item) == (FindingStatus.UNREACHABLE, "ssh")
    assert by_node["node5"].layer is Layer.CONFIGURATION


def test_render_diff_attributes() -> None:
    declared, actual, diff = render_diff(
        {"before": {"path": "/etc/x", "mode": "0600"}, "after": {"path": "/etc/x",
                                                                "mode": "0644"}}, "/etc/x")
    assert (declared, actual) == ("mode 0644", "mode 0600")
    assert "-mode: 0600" in diff and "+mode: 0644" in diff
