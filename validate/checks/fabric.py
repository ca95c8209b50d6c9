"""fabric.ib: InfiniBand/RoCE ports active at the expected rate (``ibstat``).

Rows: ``active_ports`` (ports Active+LinkUp against the profile's ``nic_count``; code
``fabric.ib.port_down``) and ``min_rate_gbps`` (slowest active port against ``nic_rate_gbps``;
code ``fabric.ib.rate_low``). Skipped for pools without RDMA NICs. A port rate above the
physical ceiling is a ``tool.implausible`` error, not a figure.
"""

from __future__ import annotations

from validate.checks.base import Check, NodeContext, ToolFailure, Verdict, parsed
from validate.model import CODE_IMPLAUSIBLE, Status
from validate.parsers import ibstat
from validate.profiles import CEILING_NIC_GBPS


class FabricIb(Check):
    id = "fabric.ib"
    title = "InfiniBand ports active at rate"
    order = 40

    def skip_reason(self, ctx: NodeContext) -> str | None:
        return "profile expects no RDMA NICs" if ctx.profile.hardware.nic_count == 0 else None

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        # ibstat exits 255 after an ibpanic but still prints the CAs it read.
        out = ctx.output(("ibstat",), ok_rcs=(0, 255)).stdout
        report = parsed(ibstat.parse_report, out, "ibstat")
        hw = ctx.profile.hardware
        layer = LINK_LAYER.get(ctx.node.gpu_pool.get("fabric", ""))
        return judge_ib(report, hw.nic_count, hw.nic_rate_gbps, layer)


# gpu_pool.fabric -> the ibstat link layer of the GPU fabric's ports. Other ports (a bonded
# Ethernet management HCA on an InfiniBand node, say) are not the GPU fabric.
# The multi-node pair check (validate.fabric runs it): its id and title here, where the registry
# reads them without loading the pair runner.
PAIR_CHECK_ID = "fabric.nccl_pair"
PAIR_TITLE = "NCCL all-reduce across node pairs of a pool (multi-node fabric, suspect/confirm)"
LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}


def judge_ib(
    report: ibstat.IbstatReport, nic_count: int, rate_gbps: float, link_layer: str | None = None
) -> list[Verdict]:
    """Active ports vs ``nic_count`` and the slowest active port vs ``rate_gbps``, counting
    only ports of ``link_layer`` when given."""
    ports = [
        (ca.name, p)
        for ca in report.cas
        for p in ca.ports
        if link_layer is None or p.link_layer == link_layer
    ]
    up = [(n, p) for n, p in ports if p.state == "Active" and p.physical_state == "LinkUp"]
    absurd = [f"{n}/{p.number}: {p.rate_gbps:g} Gb/s" for n, p in up
              if not p.rate_gbps <= CEILING_NIC_GBPS]
    if absurd:
        raise ToolFailure(CODE_IMPLAUSIBLE, f"ibstat reports {', '.join(absurd)}, above the "
                                            f"{CEILING_NIC_GBPS:g} Gb/s any port carries: not a "
                                            "measurement")
    down = [f"{n}/{p.number}: {p.state}/{p.physical_state}" for n, p in ports if (n, p) not in up]
    down += list(report.errors)
    count_ok = len(up) >= nic_count
    out = [
        Verdict(
            "active_ports",
            Status.PASS if count_ok else Status.FAIL,
            "ok" if count_ok else "fabric.ib.port_down",
            "; ".join(down),
            float(len(up)),
            "ports",
            None,
            float(nic_count),
        )
    ]
    slow = [f"{n}/{p.number}: {p.rate_gbps:g}" for n, p in up if p.rate_gbps < rate_gbps]
    rate = min((p.rate_gbps for _, p in up), default=0.0)
    out.append(
        Verdict(
            "min_rate_gbps",
            Status.FAIL if slow or not up else Status.PASS,
            "fabric.ib.rate_low" if slow or not up else "ok",
            "; ".join(slow),
            rate,
            "Gb/s",
            None,
            float(rate_gbps),
        )
    )
    return out


CHECKS: tuple[Check, ...] = (FabricIb(),)
