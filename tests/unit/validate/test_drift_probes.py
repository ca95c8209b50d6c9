"""Live probes and the performance layer, on real captures served by a
scripted transport (only the transport is scripted; the findings come from the code)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.validate.test_checks_runner import ScriptedTransport, _node, _out
from validate.checks import select
from validate.checks.base import NodeContext
from validate.drift import performance, probes
from validate.drift.config import PackageTask
from validate.drift.model import FindingStatus
from validate.history import BaselineSettings, baselines
from validate.model import CheckResult, Status
from validate.profiles import load_profile
from validate.report import write_report
from validate.transport import CommandResult

# driver 535.54.03, one GPU, persistence off
XML = "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml"
DPKG = "drift-lab/dpkg-query-show-debian12-converged-node.txt"  # nvidia-utils-550 550.90.07
DUMP = "drift-lab/containerd-1.6.20-config-dump-nvidia-runtime.toml"
APPS_LOAD = "nvidia-smi-csv/h100-query-compute-apps-load.csv"
MISMATCH = ("Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 550.54\n")


def _answers(fx: Path, over: dict[tuple[str, ...], object] | None = None
             ) -> dict[tuple[str, ...], object]:
    base: dict[tuple[str, ...], object] = {
        ("systemd-detect-virt",): _out("none\n", rc=1),
        ("uname", "-r"): _out("6.1.0-26-amd64\n"),
        probes.DPKG_ARGV: _out((fx / DPKG).read_text()),
        ("dpkg-query", "--search"): _out("nvidia-utils-550: /usr/bin/nvidia-smi\n"),
        ("cat", probes.MODULE_VERSION): _out("535.54.03\n"),
        ("nvidia-smi", "-q", "-x"): _out((fx / XML).read_text()),
        probes.COMPUTE_APPS: _out((fx / APPS_LOAD).read_text().splitlines()[0] + "\n"),
        ("systemctl", "is-active"): _out("active\nactive\nactive\nactive\n"),
        ("containerd", "config", "dump"): _out((fx / DUMP).read_text()),
        ("ls", "-1", "/sys/module"): _out("overlay\nbr_netfilter\nnvidia\nnvidia_peermem\n"),
    }
    base.update(over or {})
    return base


def _probe(fx: Path, pin: str = "535.54.03",
           over: dict[tuple[str, ...], object] | None = None) -> probes.NodeProbe:
    node = _node(nvidia_driver_version=pin)
    profile = load_profile(node.profile)
    t = ScriptedTransport(node.name, _answers(fx, over))  # type: ignore[arg-type]
    return probes.probe(NodeContext("r1", node, profile, t, 10.0))


def _items(p: probes.NodeProbe) -> dict[tuple[str, str], tuple[str, str]]:
    return {(f.layer.value, f.item): (f.declared, f.actual) for f in p.findings}


def test_versions_and_runtime_from_real_captures(fixtures_dir: Path) -> None:
    p = _probe(fixtures_dir)
    got = _items(p)
    # The library (package owning nvidia-smi) is 550.90.07; module and NVML say 535.54.03.
    assert got[("versions", "driver library")] == ("535.54.03", "550.90.07")
    assert got[("versions", "driver module/library")] == (
        "the same version", "module 535.54.03, library 550.90.07")
    assert ("versions", "driver module") not in got  # the module is at the pin
    assert got[("runtime", "persistence mode")][1] == "Disabled on GPU0"
    assert set(got) == {("versions", "driver library"), ("versions", "driver module/library"),
                        ("runtime", "persistence mode")}
    assert p.busy == [] and p.smi is not None and p.container is None


def test_mismatch_missing_runtime_inactive_unit_missing_module(fixtures_dir: Path) -> None:
    dump = (fixtures_dir / DUMP).read_text().replace("runtimes.nvidia", "runtimes.other")
    p = _probe(
        fixtures_dir, pin="550.90.07",
        over={("nvidia-smi", "-q", "-x"): _out(MISMATCH, rc=18),
           ("cat", probes.MODULE_VERSION): _out("", rc=1),
           ("systemctl", "is-active"): _out("active\nactive\ninactive\nactive\n", rc=3),
           ("systemctl", "is-enabled"): _out("enabled\n"),
           ("test", "-e"): _out("", rc=1),
           ("containerd", "config", "dump"): _out(dump),
           ("ls", "-1", "/sys/module"): _out("overlay\nnvidia\n")})
    got = _items(p)
    mm = next(f for f in p.findings if f.item == "driver module/library")
    assert mm.actual == "module unknown, library 550.90.07 (NVML 550.54)"
    assert "Driver/library version mismatch" in mm.detail
    assert ("versions", "driver library") not in got  # the library is at the pin
    assert got[("runtime", "containerd runtime nvidia")][1] == "missing"
    # a100 profile has NVSwitch: containerd, kubelet, persistenced, fabric manager
    assert got[("runtime", "service nvidia-persistenced.service")] == ("active", "inactive")
    assert got[("runtime", "module br_netfilter")] == ("loaded", "not loaded")
    assert got[("runtime", "module nvidia-peermem")] == ("loaded", "not loaded")
    assert p.smi is None and p.busy is None and "cannot tell" in p.busy_problem


def test_a_pinned_driver_that_cannot_be_read_is_an_error_not_silence(fixtures_dir: Path) -> None:
    """No package owns nvidia-smi, no module version, nvidia-smi not found: without a version
    to compare, drift says so rather than reporting nothing (as if at the pin)."""
    p = _probe(fixtures_dir, over={
        ("dpkg-query", "--search"): _out("dpkg-query: no path found matching pattern\n", rc=1),
        ("cat", probes.MODULE_VERSION): _out("", rc=1),
        ("nvidia-smi", "-q", "-x"): _out("sh: 1: nvidia-smi: not found\n", rc=127)})
    driver = [f for f in p.findings if f.item == "driver"]
    assert [(f.layer.value, f.declared, f.actual, f.status) for f in driver] == [
        ("versions", "535.54.03", "unreadable", FindingStatus.ERROR)]
    assert "nvidia-smi exited 127" in driver[0].detail
    assert not [f for f in _probe(fixtures_dir).findings if f.item == "driver"]  # readable


def test_container_skips_kernel_modules_and_kernel_pin(fixtures_dir: Path) -> None:
    p = _probe(fixtures_dir, over={("systemd-detect-virt",): _out("systemd-nspawn\n"),
                                   ("ls", "-1", "/sys/module"): _out("")})
    assert p.container == "systemd-nspawn"
    assert not [f for f in p.findings if f.item.startswith("module ")]


def test_unreachable_node_is_one_finding(fixtures_dir: Path) -> None:
    from validate.transport import Unreachable  # noqa: PLC0415

    def gone(argv: tuple[str, ...]) -> CommandResult:
        raise Unreachable("n1", "connect timed out")

    p = _probe(fixtures_dir, over={("systemd-detect-virt",): gone})
    assert [(f.status, f.item) for f in p.findings] == [(FindingStatus.UNREACHABLE, "ssh")]


def test_packages_against_declared_pins(fixtures_dir: Path) -> None:
    from validate.parsers import dpkg_query  # noqa: PLC0415

    installed = dpkg_query.parse(
        (fixtures_dir / "drift-lab/dpkg-query-show-debian12-driver-downgraded-unheld.txt")
        .read_text())
    tasks = [PackageTask("nvidia_driver", "Install", {
        "nvidia-driver-550": "550.90.07-0ubuntu1", "containerd": "",
        "nvidia-fabricmanager-550": None, "fio": "9.9"}, True, "Inst ..."),
        PackageTask("x", "Absent", {"kubelet": None}, False, "")]
    got = {f.item: (f.declared, f.actual) for f in
           probes.package_findings("n1", "p", tasks, installed)}
    assert got == {"package nvidia-driver-550": ("550.90.07-0ubuntu1", "550.54.15-0ubuntu1"),
                   "package fio": ("9.9", "3.33-3"),
                   "package kubelet": ("absent", installed["kubelet"].version)}


def test_busy_reason_from_real_capture(fixtures_dir: Path) -> None:
    from validate.parsers import nvidia_smi_csv  # noqa: PLC0415

    p = probes.NodeProbe(busy=nvidia_smi_csv.parse_query_compute_apps(
        (fixtures_dir / APPS_LOAD).read_text()))
    reason = performance.busy_reason(p)
    assert reason.startswith("GPU work in progress: pid 11327 /root/tools/memhog")
    assert "./gpu_burn" in reason
    assert performance.busy_reason(probes.NodeProbe(busy=[])) == ""


def test_busy_node_runs_light_checks_only(fixtures_dir: Path) -> None:
    node = _node()
    profile = load_profile(node.profile)
    t = ScriptedTransport(node.name, _answers(fixtures_dir))  # type: ignore[arg-type]
    p = probes.NodeProbe(busy=[], smi=object())  # type: ignore[arg-type]
    from validate.parsers import nvidia_smi_csv  # noqa: PLC0415

    p.busy = nvidia_smi_csv.parse_query_compute_apps((fixtures_dir / APPS_LOAD).read_text())
    rows = performance.measure(node, profile, select("gpu.pcie,nccl.allreduce,storage.fio"),
                               p, "r1", t, 10.0)
    assert not [c for c in t.calls if c[0] in ("all_reduce_perf", "fio", "sh")]
    heavy = [r for r in rows if r.check in ("nccl.allreduce", "storage.fio")]
    assert [(r.status, r.code) for r in heavy] == [(Status.SKIP, "drift.gpu_busy")] * 2
    assert {r.check for r in rows if r.status is Status.PASS} == {"gpu.pcie"}


def _row(node: str, check: str, metric: str, value: float, status: Status = Status.PASS,
         run: str = "now") -> CheckResult:
    return CheckResult(run, "t", node, "p", "prof", check, metric, value, "GB/s", None,
                       None, status, "ok" if status is Status.PASS else "x", "", 0.1)


def test_judge_against_history(tmp_path: Path) -> None:
    statuses = [Status.PASS, Status.PASS, Status.FAIL, Status.PASS, Status.PASS, Status.PASS]
    for i, (v1, st) in enumerate(zip([100, 101, 5, 99, 100, 102], statuses, strict=True)):
        run = f"2026010{i}T000000Z"
        write_report([_row("n1", "nccl.allreduce", "busbw_gbps", v1, st, run),
                      _row("n2", "nccl.allreduce", "busbw_gbps", 50.0, Status.PASS, run)],
                     tmp_path, run)
    bases = baselines(tmp_path, ["n1", "n2", "n3"], [("nccl.allreduce", "busbw_gbps")],
                      BaselineSettings())
    nodes = {n: _node(n, gpuready_drift_margins={"nccl_busbw_gbps": 0.5} if n == "n2" else {})
             for n in ("n1", "n2", "n3")}
    rows = [_row("n1", "nccl.allreduce", "busbw_gbps", 85.0),
            _row("n2", "nccl.allreduce", "busbw_gbps", 30.0),
            _row("n3", "nccl.allreduce", "busbw_gbps", 30.0)]
    out_rows, findings = performance.judge(rows, nodes, bases, BaselineSettings())
    by = {f.node: f for f in findings}
    # The failing run is not part of the baseline: median of 100, 101, 99, 100, 102.
    assert by["n1"].status is FindingStatus.DRIFT and "baseline 100" in by["n1"].declared
    assert "15% below the median 100 of the last 5 passing runs" in by["n1"].detail
    assert "n2" not in by  # 40% below, inside its own 50% margin
    assert by["n3"].status is FindingStatus.SKIPPED and "0 passing run" in by["n3"].detail
    drifted = next(r for r in out_rows if r.node == "n1")
    assert (drifted.status, drifted.code) == (Status.WARN, performance.CODE_BELOW)
    assert next(r for r in out_rows if r.node == "n2").status is Status.PASS


def test_a_failing_tool_costs_only_its_own_probe(fixtures_dir: Path) -> None:
    def hung(argv: tuple[str, ...]) -> CommandResult:
        return CommandResult(argv, -1, "", "", 10.0, True)

    p = _probe(fixtures_dir, over={
        ("systemctl", "is-active"): _out("active\ninactive\nactive\nactive\n", rc=3),
        ("systemctl", "is-enabled"): hung})
    errors = [(f.layer.value, f.item, f.actual) for f in p.findings
              if f.status is FindingStatus.ERROR]
    assert errors == [("runtime", "services", "tool.timeout")]
    # the probes after it still ran
    assert ("runtime", "persistence mode") in _items(p)


def test_a_package_dpkg_did_not_finish_is_drift_with_its_version_and_state(
        fixtures_dir: Path) -> None:
    """A real dpkg database in which kubelet's postinst failed (half-configured at the pinned
    version): drift says what dpkg has, as the upgrade plan does, not "absent"."""
    from validate.parsers import dpkg_query  # noqa: PLC0415

    installed = dpkg_query.parse(
        (fixtures_dir / "dpkg-query/dpkg-1.21.22-debian12-kubelet-half-configured-held.txt")
        .read_text())
    tasks = [PackageTask("kubelet", "Install", {"kubelet": "1.37.2-1.1", "kubeadm": "1.37.2-1.1",
                                                "kubectl": ""}, True, "Inst ...")]
    got = {f.item: (f.declared, f.actual) for f in
           probes.package_findings("n1", "p", tasks, installed)}
    assert got == {"package kubelet": ("1.37.2-1.1", "1.37.2-1.1 (half-configured)")}
    # Wanted gone: a package dpkg still lists as half-configured is not gone.
    gone = [PackageTask("x", "Absent", {"kubelet": None, "kubeadm": None}, False, "")]
    assert [(f.item, f.declared, f.actual) for f in
            probes.package_findings("n1", "p", gone, installed)] == [
        ("package kubelet", "absent", "1.37.2-1.1 (half-configured)"),
        ("package kubeadm", "absent", "1.37.2-1.1")]


def test_a_pinned_dcgm_expects_the_roles_host_engine_running(fixtures_dir: Path) -> None:
    """Where the inventory pins DCGM, the nvidia_dcgm role's nv-hostengine is the node's one
    host engine (the GPU Operator's exporter connects to it): a stopped one is runtime drift,
    and says why it matters."""
    node = _node(nvidia_dcgm_version="4.6.0")
    assert probes.dcgm_hostengine_unit() == "nvidia-dcgm.service"
    t = ScriptedTransport(node.name, _answers(fixtures_dir, {  # type: ignore[arg-type]
        ("systemctl", "is-active"): _out("active\nactive\nactive\nactive\ninactive\n", rc=3)}))
    p = probes.probe(NodeContext("r1", node, load_profile(node.profile), t, 10.0))
    unit = "nvidia-dcgm.service"
    asked = next(c for c in t.calls if "is-active" in c)
    assert asked[asked.index("is-active") + 1:] == (
        "containerd.service", "kubelet.service", "nvidia-persistenced.service",
        "nvidia-fabricmanager.service", unit)
    found = next(f for f in p.findings if f.item == f"service {unit}")
    assert (found.layer.value, found.declared, found.actual) == ("runtime", "active", "inactive")
    assert "the node's one DCGM host engine" in found.detail
    assert "dcgm-exporter connect" in found.detail
    # Without a DCGM pin the role is not asked to run one, and the unit is not asked about
    # (the other tests answer four units for the same profile).
    assert not any(f.item == f"service {unit}" for f in _probe(fixtures_dir).findings)
