"""A realistic run for report tests: real captured tool output (tests/fixtures) judged by the
checks' own ``judge_*`` functions against each node's profile exactly as the runner loads it
(``inventory.profile_for``, from a real inventory), plus one node that really is unreachable (the
runner's SSH transport against a closed port).

Each node carries the checks we hold real captures for (no 8x A100 80GB ``nvidia-smi -q``
capture exists, so the A100 pool has no identity rows; no single-node H100 ``all_reduce_perf``
capture exists, so the H100 pool runs no NCCL). What each node's rows come from:

- pool_h100_sxm (h100-sxm5-80gb-8x; inventory: drive class ``virtual``, driver pin 535.161.08)
  - gpu-h100-01..03: the 8x H100 ``nvidia-smi -q`` (identity, ECC, PCIe, persistence), a
    1x H100 capture without clock events (throttle), 18 active NVLinks, the NV18 topology with
    6 NICs (GPUs without a near NIC: warn), all-active NDR ibstat, no Xid, fio on a VM disk.
  - gpu-h100-04: throttle judged on the 8x capture, whose GPUs show HW slowdown: fail.
  - gpu-h100-05: Xid 63 in the kernel log (row remapper) and the remapped-rows-pending
    capture: warn + fail.
  - gpu-h100-06: unreachable: every check is an error row.
- pool_a100_sxm (a100-sxm4-80gb-8x, drive class ``virtual``)
  - gpu-a100-01, -02: 12 NVLinks on 8 GPUs, DGX A100 topology, all-active ibstat, NCCL 2.16
    single node at 231.72 GB/s, no Xid, fio on a VM disk.
  - gpu-a100-03: every NVLink inactive: fail.
  - gpu-a100-04: ibstat after an ibpanic on a ninth device (its 8 ports active: pass, the
    panic in the detail), nccl-tests' CUDA failure ("invalid device ordinal", error),
    Xid 13 and 43 (application faults: pass).
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from tests.conftest import closed_port
from tests.ttar import unpack
from validate.checks import REGISTRY, Verdict
from validate.checks.base import ToolFailure, parsed
from validate.checks.fabric import judge_ib, judge_ib_counters
from validate.checks.gpu import (
    judge_count,
    judge_driver,
    judge_ecc,
    judge_memory,
    judge_mig,
    judge_model,
    judge_nvlink,
    judge_pcie,
    judge_persistence,
    judge_throttle,
    judge_topology,
    judge_xid,
)
from validate.checks.nccl import judge_allreduce
from validate.checks.storage import FIO_METRICS, judge_fio
from validate.inventory import Node, load, profile_for
from validate.model import CheckResult
from validate.parsers import (
    fio,
    ib_counters,
    ibstat,
    nccl,
    nvidia_smi_nvlink,
    nvidia_smi_q,
    nvidia_smi_topo,
    xid,
)
from validate.profiles import Profile
from validate.runner import default_transport, run_node

RUN_ID = "20261202T120000Z"
TIME = "2026-12-02T12:00:00+00:00"
ENVIRONMENT = "report tests: real captures judged offline"
H100_CHECKS = ("gpu.driver", "gpu.count", "gpu.model", "gpu.memory", "gpu.ecc", "gpu.pcie",
               "gpu.persistence", "gpu.throttle", "gpu.nvlink", "gpu.topology", "gpu.xid",
               "fabric.ib", "storage.fio")
A100_CHECKS = ("gpu.nvlink", "gpu.topology", "gpu.xid", "fabric.ib", "storage.fio",
               "nccl.allreduce")
ECC_METRICS = ("uncorrectable_volatile", "correctable_volatile", "remapped_rows_pending",
               "remapped_rows_failure", "retired_pages_pending")


def write_inventory(root: Path) -> Path:
    """A two-pool inventory with the fleet's nodes; gpu-h100-06 points at a closed port."""
    (root / "group_vars").mkdir(parents=True)
    h100 = "\n".join(f"            gpu-h100-0{i}: {{ansible_host: 127.0.0.1}}" for i in range(1, 6))
    a100 = "\n".join(f"            gpu-a100-0{i}: {{ansible_host: 127.0.0.1}}" for i in range(1, 5))
    (root / "hosts.yml").write_text(
        "all:\n  vars:\n"
        f"    gpuready_environment: '{ENVIRONMENT}'\n"
        "    gpuready_drive_class: virtual\n"
        "  children:\n    gpu_nodes:\n      children:\n"
        f"        pool_h100_sxm:\n          hosts:\n{h100}\n"
        f"            gpu-h100-06: {{ansible_host: 127.0.0.1, ansible_port: {closed_port()}}}\n"
        f"        pool_a100_sxm:\n          hosts:\n{a100}\n"
    )
    (root / "group_vars" / "pool_h100_sxm.yml").write_text(
        "gpu_profile: h100-sxm5-80gb-8x\nnvidia_driver_version: '535.161.08'\n"
        "gpu_pool: {accelerator: h100-80gb, topology: 8gpu-sxm-nvlink, fabric: infiniband}\n"
    )
    (root / "group_vars" / "pool_a100_sxm.yml").write_text(
        "gpu_profile: a100-sxm4-80gb-8x\n"
        "gpu_pool: {accelerator: a100-80gb, topology: 8gpu-sxm-nvlink, fabric: infiniband}\n"
    )
    return root


class _Captures:
    def __init__(self, fixtures_dir: Path) -> None:
        self.dir = fixtures_dir

    def text(self, rel: str) -> str:
        return (self.dir / rel).read_text()


def _verdicts(cap: _Captures, node: Node, p: Profile) -> dict[str, Callable[[], list[Verdict]]]:
    """check id -> how this node's verdicts are judged from real captures."""
    name = node.name
    h100_log = nvidia_smi_q.parse(
        cap.text("nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt"))
    hw = p.hardware
    reasons = (p.value("throttle.fail_reasons", list), p.value("throttle.warn_reasons", list))
    ecc_log = h100_log
    if name == "gpu-h100-05":
        ecc_log = nvidia_smi_q.parse(cap.text(
            "nvidia-smi-q-text/a100-sxm4-80gb-remapped-rows-pending-dram-correctable-excerpt.txt"))
    throttle_log = h100_log if name == "gpu-h100-04" else nvidia_smi_q.parse(
        cap.text("nvidia-smi-q-text/h100-80gb-hbm3-sxm-vm-drv590-idle.txt"))
    nvlink = {
        "gpu-a100-03": "nvidia-smi-nvlink/a100-sxm4-80gb-nvlink-s-all-links-inactive.txt",
    }.get(name, "nvidia-smi-nvlink/h100-sxm-nvlink-s-18links.txt" if "h100" in name
          else "nvidia-smi-nvlink/a100-x8-nvlink-status-all-gpus.txt")
    topo = ("nvidia-smi-topo/h100-sxm-8gpu-nv18-ht-affinity-docspaces.txt" if "h100" in name
            else "nvidia-smi-topo/a100-sxm4-40gb-8gpu-nv12-10nic-legend-epyc7742-4numa-tabs.txt")
    ib = {"gpu-a100-04": "ibstat/ibstat-a100-azure-hdr200-ibpanic-exit255.txt"}.get(
        name, "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt" if "h100" in name
        else "ibstat/ibstat-a100-node-all-active.txt")
    kernel_log = {"gpu-h100-05": "dmesg-xid/xid63-row-remapper-new-row-marked.txt",
                  "gpu-a100-04": "dmesg-xid/xid13-xid43-dmesg-decode-iso-635-lines.log"}.get(name)
    nccl_out = ("nccl-tests/all_gather_perf-4worker-b200-test-cuda-failure-invalid-device-"
                "ordinal-excerpt.txt" if name == "gpu-a100-04"
                else "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt")
    pin = node.vars.get("nvidia_driver_version")
    window = p.value("xid.window", str)

    def xid_rows() -> list[Verdict]:
        events = xid.parse(cap.text(kernel_log)) if kernel_log else ()
        return judge_xid(events, window, p.value("xid.fail_codes", list),
                         p.value("xid.warn_codes", list), p.value("xid.ignore_codes", list),
                         p.value("xid.severity_status", dict))

    def nccl_rows() -> list[Verdict]:
        run = parsed(nccl.parse_text, cap.text(nccl_out), "all_reduce_perf")
        return judge_allreduce([run, run, run], p.band("nccl.allreduce_busbw_gbps"))

    return {
        "gpu.driver": lambda: judge_driver(h100_log, str(pin) if pin else None),
        "gpu.count": lambda: judge_count(h100_log, hw.gpu_count),
        "gpu.model": lambda: judge_model(h100_log, hw.gpu_model),
        "gpu.memory": lambda: judge_memory(h100_log, hw.gpu_memory_mib),
        "gpu.ecc": lambda: judge_ecc(ecc_log, {m: p.band(f"ecc.{m}") for m in ECC_METRICS}),
        "gpu.pcie": lambda: judge_pcie(h100_log, hw.pcie_gen, hw.pcie_width),
        "gpu.persistence": lambda: judge_persistence(h100_log),
        "gpu.throttle": lambda: judge_throttle(throttle_log, *reasons),
        "gpu.nvlink": lambda: judge_nvlink(nvidia_smi_nvlink.parse(cap.text(nvlink)),
                                           hw.nvlinks_per_gpu, hw.gpu_count),
        "gpu.topology": lambda: judge_topology(nvidia_smi_topo.parse(cap.text(topo)),
                                               hw.gpu_count, hw.nvlinks_per_gpu > 0,
                                               hw.nic_count),
        "gpu.xid": xid_rows,
        "fabric.ib": lambda: judge_ib(ibstat.parse_report(cap.text(ib)), hw.nic_count,
                                      hw.nic_rate_gbps, "InfiniBand"),
        "storage.fio": lambda: judge_fio(
            fio.parse_json(cap.text(
                "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json")),
            {m: p.band(f"fio.{m}") for m in FIO_METRICS}),
        "nccl.allreduce": nccl_rows,
        "gpu.mig": lambda: judge_mig(h100_log, node.desired.mig),
        "fabric.ib_counters": lambda: judge_ib_counters(
            _sysfs_ports(cap.dir), {},
            {c: p.band(f"ib_counters.{c}_per_h") for c in ib_counters.ERROR_COUNTERS},
            {c: p.value(f"ib_counters.{c}_high", int) for c in ib_counters.ERROR_COUNTERS},
            datetime.now(UTC)),
    }


@functools.cache
def _sysfs_ports(fixtures_dir: Path) -> tuple[ib_counters.PortCounters, ...]:
    """The real sysfs tree's port counters, read with the validators' own command."""
    with tempfile.TemporaryDirectory() as root:
        tree = unpack(fixtures_dir / "sysfs-infiniband/procfs-testdata-sys-class-infiniband-"
                      "hfi1-mlx4-2port-mlx5.ttar", Path(root), strip="fixtures/sys/")
        out = subprocess.run(["sh", "-c", ib_counters.READ_COUNTERS, "sh", str(tree)],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    return ib_counters.parse(out)


def judges(fixtures_dir: Path, node: Node, profile: Profile
           ) -> dict[str, Callable[[], list[Verdict]]]:
    """check id -> how ``node``'s verdicts are judged from real captures (by its name, as
    in the module docstring: a name with ``h100`` gets the H100 captures)."""
    return _verdicts(_Captures(fixtures_dir), node, profile)


def fleet_nodes(inventory: Path) -> tuple[Node, ...]:
    return load(inventory)


def fleet_rows(fixtures_dir: Path, nodes: tuple[Node, ...]) -> list[CheckResult]:
    """Every node's rows, in the runner's order (node by node, checks in run order)."""
    cap = _Captures(fixtures_dir)
    rows: list[CheckResult] = []
    for node in nodes:
        wanted = H100_CHECKS if node.pool == "pool_h100_sxm" else A100_CHECKS
        checks = [c for cid, c in REGISTRY.items() if cid in wanted]
        if node.name == "gpu-h100-06":
            # a real refused connection through the runner's own SSH transport
            transport = default_transport(node, accept_unknown_host_keys=True)
            try:
                rows += run_node(node, checks, RUN_ID, transport, 5.0)
            finally:
                transport.close()
            continue
        profile = profile_for(node)
        judges = _verdicts(cap, node, profile)
        for check in checks:
            try:
                verdicts = judges[check.id]()
            except ToolFailure as exc:
                verdicts = [Verdict("", exc.status, exc.code, exc.detail)]
            rows += [
                CheckResult(RUN_ID, TIME, node.name, node.pool, profile.name, check.id,
                            v.metric, v.value, v.unit, v.warn, v.fail, v.status, v.code,
                            v.detail, 0.25)
                for v in verdicts
            ]
    return rows
