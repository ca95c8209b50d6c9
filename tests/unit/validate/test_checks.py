"""Check evaluations on REAL captured tool output (tests/fixtures).

Expected values below were read off the capture files by hand (the grep-able text), not
computed with the parsers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.checks import REGISTRY, ToolFailure, select
from validate.checks.base import judged, parsed
from validate.checks.fabric import judge_ib
from validate.checks.gpu import (
    judge_count,
    judge_driver,
    judge_ecc,
    judge_memory,
    judge_model,
    judge_nvlink,
    judge_pcie,
    judge_persistence,
    judge_throttle,
    judge_topology,
    judge_xid,
)
from validate.checks.nccl import judge_allreduce
from validate.checks.node import expected_units, judge_services
from validate.checks.storage import judge_checkpoint, judge_fio, safe_base
from validate.model import Status
from validate.parsers import (
    fio,
    ibstat,
    nccl,
    nvidia_smi_nvlink,
    nvidia_smi_q,
    nvidia_smi_topo,
    nvidia_smi_xml,
    xid,
)
from validate.profiles import Band, load_profile

H100_Q = "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt"


def _read(fixtures_dir: Path, rel: str) -> str:
    return (fixtures_dir / rel).read_text()


@pytest.fixture(scope="module")
def h100_log(fixtures_dir: Path) -> nvidia_smi_q.NvidiaSmiLog:  # type: ignore[name-defined]
    return nvidia_smi_q.parse(_read(fixtures_dir, H100_Q))


def test_registry_has_every_issue_check() -> None:
    assert set(REGISTRY) == {
        "gpu.count",
        "gpu.model",
        "gpu.memory",
        "gpu.driver",
        "gpu.ecc",
        "gpu.pcie",
        "gpu.nvlink",
        "gpu.topology",
        "gpu.persistence",
        "gpu.xid",
        "gpu.throttle",
        "gpu.mig",
        "nccl.allreduce",
        "storage.fio",
        "storage.checkpoint",
        "fabric.ib",
        "fabric.ib_counters",
        "node.services",
        "dcgm.diag",
        "dcgm.exporter",
        "dcgm.diag_r2",
        "dcgm.diag_r3",
    }
    assert [c.id for c in select("gpu.c*,nccl.*")] == ["gpu.count", "nccl.allreduce"]
    # long benchmarks run last
    assert list(REGISTRY)[-1] == "nccl.allreduce"


def test_identity_checks_on_real_8x_h100(h100_log: object) -> None:
    log = h100_log
    assert judge_count(log, 8)[0].status is Status.PASS  # type: ignore[arg-type]
    missing = judge_count(log, 9)[0]  # type: ignore[arg-type]
    assert (missing.status, missing.code, missing.value) == (Status.FAIL, "gpu.count.missing", 8)
    assert judge_model(log, "NVIDIA H100 80GB HBM3")[0].status is Status.PASS  # type: ignore[arg-type]
    wrong = judge_model(log, "NVIDIA H200")[0]  # type: ignore[arg-type]
    assert wrong.code == "gpu.model.mismatch" and "GPU0" in wrong.detail
    assert judge_memory(log, 81559)[0].value == 81559  # type: ignore[arg-type]
    assert judge_memory(log, 143771)[0].code == "gpu.memory.mismatch"  # type: ignore[arg-type]
    # capture's driver is 535.161.08; the lab pin is 550.90.07
    drv = judge_driver(log, "550.90.07")[0]  # type: ignore[arg-type]
    assert (drv.status, drv.code) == (Status.FAIL, "gpu.driver.version_mismatch")
    assert "535.161.08" in drv.detail
    assert judge_driver(log, "535.161.08")[0].status is Status.PASS  # type: ignore[arg-type]
    assert judge_driver(log, None)[0].status is Status.SKIP  # type: ignore[arg-type]
    assert judge_persistence(log)[0].status is Status.PASS  # type: ignore[arg-type]
    pcie = judge_pcie(log, 5, 16)  # type: ignore[arg-type]
    assert [v.status for v in pcie] == [Status.PASS, Status.PASS]
    assert judge_pcie(log, 6, 16)[1].code == "gpu.pcie.degraded"  # type: ignore[arg-type]


def test_throttle_flags_hw_slowdown_in_real_capture(h100_log: object) -> None:
    # The capture's GPUs show "HW Slowdown : Active" and "HW Power Brake Slowdown : Active".
    v = judge_throttle(h100_log, ["hw_power_brake_slowdown"], [])[0]  # type: ignore[arg-type]
    assert (v.status, v.code, v.value) == (Status.FAIL, "gpu.throttle.hw_power_brake_slowdown", 8)
    assert judge_throttle(h100_log, [], [])[0].status is Status.PASS  # type: ignore[arg-type]


def _ecc_bands() -> dict[str, Band]:
    p = load_profile("a100-sxm4-80gb-8x")
    return {
        m: p.band(f"ecc.{m}")
        for m in (
            "uncorrectable_volatile",
            "correctable_volatile",
            "remapped_rows_pending",
            "remapped_rows_failure",
            "retired_pages_pending",
        )
    }


def test_ecc_on_real_fault_captures(fixtures_dir: Path, h100_log: object) -> None:
    clean = {v.metric: v for v in judge_ecc(h100_log, _ecc_bands())}  # type: ignore[arg-type]
    assert clean["uncorrectable_volatile"].status is Status.PASS
    # H100 retires no pages (it remaps rows): not reported -> skip, not pass
    assert clean["retired_pages_pending"].status is Status.SKIP
    remap = nvidia_smi_q.parse(
        _read(
            fixtures_dir,
            "nvidia-smi-q-text/a100-sxm4-80gb-remapped-rows-pending-dram-correctable-excerpt.txt",
        )
    )
    rows = {v.metric: v for v in judge_ecc(remap, _ecc_bands())}
    assert (rows["remapped_rows_pending"].status, rows["remapped_rows_pending"].code) == (
        Status.FAIL,
        "gpu.ecc.remap_pending",
    )
    assert rows["correctable_volatile"].value == 177  # "DRAM Correctable : 177", under limits
    assert rows["correctable_volatile"].status is Status.PASS
    sram = nvidia_smi_q.parse(
        _read(fixtures_dir, "nvidia-smi-q-text/sram-uncorrectable-ecc-errors-excerpt.txt")
    )
    unc = {v.metric: v for v in judge_ecc(sram, _ecc_bands())}["uncorrectable_volatile"]
    assert (unc.status, unc.code, unc.value) == (Status.FAIL, "gpu.ecc.uncorrectable", 1)


def test_ecc_mode_disabled_fails_when_the_profile_expects_it_on(fixtures_dir: Path,
                                                               h100_log: object) -> None:
    on = judge_ecc(h100_log, _ecc_bands(), "enabled")[0]  # type: ignore[arg-type]
    assert (on.metric, on.status, on.code, on.value) == ("ecc_mode", Status.PASS, "ok", 0.0)
    # a real workstation capture: two RTX A5000 with ECC off ("<current_ecc>Disabled")
    off_log = nvidia_smi_xml.parse(
        _read(fixtures_dir, "nvidia-smi-xml/rtx-a5000-x2-drv590-v13.xml"))
    off = judge_ecc(off_log, _ecc_bands(), "enabled")[0]
    assert (off.status, off.code, off.value) == (Status.FAIL, "gpu.ecc.mode_disabled", 2.0)
    assert "GPU0(" in off.detail and "=Disabled" in off.detail
    assert judge_ecc(off_log, _ecc_bands(), "disabled")[0].status is Status.PASS
    # "any" (the default) adds no row; a vGPU that prints N/A is not judged
    assert "ecc_mode" not in {v.metric for v in judge_ecc(off_log, _ecc_bands())}
    vgpu = nvidia_smi_xml.parse(
        _read(fixtures_dir, "nvidia-smi-xml/grid-p4-1q-vgpu-drv513-windows-v11.xml"))
    assert judge_ecc(vgpu, _ecc_bands(), "enabled")[0].status is Status.SKIP
    # every shipped profile expects ECC on
    assert {load_profile(n).value("ecc.expect_mode", str) for n in
            ("a100-sxm4-80gb-8x", "h100-sxm5-80gb-8x", "h200-sxm-141gb-8x",
             "l40s-pcie-48gb-4x")} == {"enabled"}


def test_nvlink_on_real_captures(fixtures_dir: Path) -> None:
    def links(name: str) -> tuple[nvidia_smi_nvlink.GpuNvlinks, ...]:
        return nvidia_smi_nvlink.parse(_read(fixtures_dir, f"nvidia-smi-nvlink/{name}"))

    ok = judge_nvlink(links("a100-x8-nvlink-status-all-gpus.txt"), 12, 8)[0]
    assert (ok.status, ok.value) == (Status.PASS, 12)
    down = judge_nvlink(links("a100-sxm4-80gb-nvlink-s-all-links-inactive.txt"), 12, 8)[0]
    assert (down.status, down.code, down.value) == (Status.FAIL, "gpu.nvlink.down", 0)
    assert "GPU6" in down.detail and "all-inactive" in down.detail
    assert judge_nvlink(links("a10-nvlink-status-empty-output.txt"), 12, 8)[0].status is (
        Status.FAIL
    )


def test_topology_on_real_matrices(fixtures_dir: Path) -> None:
    name = "nvidia-smi-topo/a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt"
    dgx = nvidia_smi_topo.parse(_read(fixtures_dir, name))
    rows = {v.metric: v for v in judge_topology(dgx, 8, True, 8)}
    assert rows["gpus_in_matrix"].status is Status.PASS
    assert rows["pairs_without_nvlink"].value == 0
    assert rows["gpus_without_near_nic"].status is Status.PASS
    # the same NVLink box judged as a PCIe-only pool must flag its NV12 pairs (28 pairs)
    pcie_view = {v.metric: v for v in judge_topology(dgx, 8, False, 0)}
    assert pcie_view["pairs_with_nvlink"].value == 28
    single = nvidia_smi_topo.parse(
        _read(fixtures_dir, "nvidia-smi-topo/l40s-single-gpu-topo-m-ansi.txt")
    )
    count = judge_topology(single, 4, False, 0)[0]
    assert (count.status, count.code, count.value) == (Status.FAIL, "gpu.topology.gpu_count", 1)


def test_xid_policy_on_real_kernel_logs(fixtures_dir: Path) -> None:
    policy = load_profile("h100-sxm5-80gb-8x")
    sev = policy.value("xid.severity_status", dict)
    events = xid.parse(_read(fixtures_dir, "dmesg-xid/xid13-xid43-dmesg-decode-iso-635-lines.log"))
    rows = {v.metric: v for v in judge_xid(events, "-24h", [], [], [], sev)}
    assert set(rows) == {"xid_13", "xid_43"}
    assert rows["xid_13"].status is Status.PASS  # info: application fault
    assert "0000:38:00" in rows["xid_13"].detail and "action:" in rows["xid_13"].detail
    forced = {v.metric: v for v in judge_xid(events, "-24h", [13], [], [], sev)}
    assert (forced["xid_13"].status, forced["xid_13"].code) == (Status.FAIL, "gpu.xid.13")
    remap = xid.parse(_read(fixtures_dir, "dmesg-xid/xid63-row-remapper-new-row-marked.txt"))
    r63 = judge_xid(remap, "-24h", [], [], [], sev)[0]
    assert r63.code == "gpu.xid.63" and r63.status in (Status.WARN, Status.FAIL)
    none = judge_xid((), "-24h", [], [], [], sev)[0]
    assert (none.status, none.value) == (Status.PASS, 0)


def test_allreduce_on_real_nccl_output(fixtures_dir: Path) -> None:
    run = nccl.parse_text(
        _read(
            fixtures_dir, "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt"
        )
    )
    band = load_profile("a100-sxm4-80gb-8x").band("nccl.allreduce_busbw_gbps")
    bus, wrong = judge_allreduce([run, run, run], band)
    # last row of the table: 1073741824 B, out-of-place busbw 231.72
    assert (bus.status, bus.value, bus.fail) == (Status.PASS, 231.72, 228.0)
    assert wrong.status is Status.PASS and wrong.value == 0
    h100 = load_profile("h100-sxm5-80gb-8x").band("nccl.allreduce_busbw_gbps")
    low = judge_allreduce([run], h100)[0]
    assert (low.status, low.code) == (Status.FAIL, "nccl.allreduce.low_busbw")


def test_allreduce_failure_capture_is_an_error_naming_the_cause(fixtures_dir: Path) -> None:
    text = _read(
        fixtures_dir,
        "nccl-tests/all_gather_perf-4worker-b200-test-cuda-failure-"
        "invalid-device-ordinal-excerpt.txt",
    )
    with pytest.raises(ToolFailure) as info:
        parsed(nccl.parse_text, text, "all_reduce_perf")
    assert info.value.code == "tool.parse_error" and info.value.status is Status.ERROR
    assert "'invalid device ordinal'" in info.value.detail


def test_ib_on_real_ibstat(fixtures_dir: Path) -> None:
    h100 = ibstat.parse_report(
        _read(fixtures_dir, "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt")
    )
    ports, rate = judge_ib(h100, 8, 400, "InfiniBand")
    assert (ports.status, ports.value, rate.status, rate.value) == (
        Status.PASS,
        8,
        Status.PASS,
        400,
    )
    # without the link-layer filter the bonded 200G Ethernet HCA drags the minimum down
    assert judge_ib(h100, 8, 400)[1].code == "fabric.ib.rate_low"
    panic = ibstat.parse_report(
        _read(fixtures_dir, "ibstat/ibstat-a100-azure-hdr200-ibpanic-exit255.txt")
    )
    ports, _ = judge_ib(panic, 9, 200, "InfiniBand")
    assert (ports.status, ports.code) == (Status.FAIL, "fabric.ib.port_down")
    assert "mlx5_8" in ports.detail


def test_fio_on_real_json(fixtures_dir: Path) -> None:
    run = fio.parse_json(
        _read(
            fixtures_dir,
            "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json",
        )
    )
    p = load_profile("h100-sxm5-80gb-8x")
    rows = {
        v.metric: v
        for v in judge_fio(
            run,
            {
                m: p.band(f"fio.{m}")
                for m in ("seq_write_mibps", "seq_read_mibps", "randread_4k_iops")
            },
        )
    }
    # bw_bytes 2656136811 (write), 723835609 (read); iops 20925.02
    assert rows["seq_write_mibps"].value == round(2656136811 / 2**20, 2)
    assert rows["seq_read_mibps"].value == round(723835609 / 2**20, 2)
    assert rows["randread_4k_iops"].value == round(20925.024992, 2)
    # a VM disk against NVMe Gen4 floors: read and IOPS fail
    assert rows["seq_read_mibps"].code == "storage.fio.seq_read_mibps_low"
    assert rows["randread_4k_iops"].status is Status.FAIL


def test_services_and_checkpoint_and_paths() -> None:
    units = expected_units(True)
    assert units[-1] == "nvidia-fabricmanager.service" and len(expected_units(False)) == 3
    v = judge_services(units, "active\nactive\nactive\nfailed\n")[0]
    assert (v.status, v.code, v.detail) == (
        Status.FAIL,
        "node.services.inactive",
        "nvidia-fabricmanager.service=failed",
    )
    with pytest.raises(ToolFailure):
        judge_services(units, "active\n")
    band = Band(2.0, 1.0)
    # kubelet before kubeadm join: inactive passes only while it waits for the join
    waiting = judge_services(units, "active\ninactive\nactive\nactive\n", True)[0]
    assert (waiting.status, waiting.detail) == (Status.PASS,
                                                "kubelet enabled, waiting for kubeadm join")
    joined = judge_services(units, "active\ninactive\nactive\nactive\n", False)[0]
    assert (joined.status, joined.detail) == (Status.FAIL, "kubelet.service=inactive")
    # dd's own byte counts (1024 MiB each way) make the timings measurements
    w, r = judge_checkpoint("write_ns=2000000000\nwrite_rc=0\nwrite_bytes=1073741824\n"
                            "read_ns=500000000\nread_rc=0\nread_bytes=1073741824\n", 1024,
                            band, band)
    assert (w.value, w.status, r.value, r.status) == (0.537, Status.FAIL, 2.147, Status.PASS)
    for bad in ("", "relative/path", "/", "/dev/nvme0n1", "/proc", "/var/tmp/../etc", "/run/x"):
        with pytest.raises(ToolFailure):
            safe_base(bad)
    assert safe_base("/var/tmp/") == "/var/tmp"


def test_xml_parser_feeds_the_same_checks(fixtures_dir: Path) -> None:
    # One -q -x capture drives count/model/memory: 4x A100-SXM4-80GB, driver 535.54.03.
    log = nvidia_smi_xml.parse(
        _read(fixtures_dir, "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml")
    )
    assert judge_model(log, "NVIDIA A100-SXM4-80GB")[0].status is Status.PASS
    assert judge_memory(log, 81920)[0].status is Status.PASS
    assert judge_driver(log, "535.54.03")[0].status is Status.PASS


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_judging_a_non_finite_value_is_an_error_row(value: float) -> None:
    """NaN compares false to every limit: without this, a NaN bus bandwidth would pass."""
    band = Band(warn=470.0, fail=460.0)
    v = judged("busbw_gbps", value, "GB/s", band, "nccl.allreduce.low_busbw")
    assert (v.status, v.code, v.value) == (Status.ERROR, "check.non_finite_value", None)
    assert judged("busbw_gbps", 480.0, "GB/s", band, "x").status is Status.PASS
