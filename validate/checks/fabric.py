"""fabric.ib: InfiniBand/RoCE ports active at the expected rate (``ibstat``).
fabric.ib_counters: each port's error counters (sysfs), judged by their growth since the
node's previous run.

Rows: ``active_ports`` (ports Active+LinkUp against the profile's ``nic_count``; code
``fabric.ib.port_down``) and ``min_rate_gbps`` (slowest active port against ``nic_rate_gbps``;
code ``fabric.ib.rate_low``). Skipped for pools without RDMA NICs. A port rate above the
physical ceiling is a ``tool.implausible`` error, not a figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from validate.checks.base import Check, NodeContext, ToolFailure, Verdict, parsed
from validate.model import CODE_IMPLAUSIBLE, Status
from validate.parsers import ib_counters, ibstat
from validate.profiles import CEILING_NIC_GBPS, Band


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


# The sysfs root a node's commands see (a validator in a pod sees the host's at /host/sys).
DEFAULT_SYSFS_ROOT = "/sys"
# Codes of fabric.ib_counters: a counter that grew faster than its band, by counter, and a
# counter past its "high" count that did not grow.
GROWING = {
    "link_downed": "fabric.ib.link_downed_growing",
    "link_error_recovery": "fabric.ib.link_error_recovery_growing",
    "symbol_error": "fabric.ib.symbol_error_growing",
    "port_rcv_errors": "fabric.ib.port_rcv_errors_growing",
    "excessive_buffer_overrun_errors": "fabric.ib.excessive_buffer_overrun_errors_growing",
}
CODE_COUNTER_HIGH = "fabric.ib.counter_high"
# The widths of these counters in the InfiniBand PortCounters attribute (SymbolErrorCounter and
# PortRcvErrors 16 bits, LinkErrorRecoveryCounter and LinkDownedCounter 8, ExcessiveBuffer-
# OverrunErrors 4): a counter at its maximum stops counting, so its growth can no longer show.
SATURATED = {"link_downed": 255, "link_error_recovery": 255, "symbol_error": 65535,
             "port_rcv_errors": 65535, "excessive_buffer_overrun_errors": 15}
CODE_COUNTER_MISSING = "fabric.ib.counter_missing"


class FabricIbCounters(Check):
    id = "fabric.ib_counters"
    title = "InfiniBand port error counters: growth since the previous run"
    order = 41
    wants_history = True

    def skip_reason(self, ctx: NodeContext) -> str | None:
        return "profile expects no RDMA NICs" if ctx.profile.hardware.nic_count == 0 else None

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        root = ctx.node.desired.sysfs_root or DEFAULT_SYSFS_ROOT
        out = ctx.output(("sh", "-c", ib_counters.READ_COUNTERS, "sh", root)).stdout
        ports = parsed(ib_counters.parse, out, f"{root}/class/infiniband/*/ports/*/counters")
        p = ctx.profile
        bands = {c: p.band(f"ib_counters.{c}_per_h") for c in ib_counters.ERROR_COUNTERS}
        high = {c: p.value(f"ib_counters.{c}_high", int, 2**63)
                for c in ib_counters.ERROR_COUNTERS}
        if not ports:
            return [Verdict("ports", Status.ERROR, CODE_COUNTER_MISSING,
                            f"no InfiniBand port counters under {root}/class/infiniband, where "
                            f"the profile expects {ctx.profile.hardware.nic_count} ports "
                            "(gpuready_sysfs_root?)", 0.0, "ports")]
        return judge_ib_counters(ports, ctx.previous, bands, high, datetime.now(UTC))


def counter_metric(port: ib_counters.PortCounters, counter: str) -> str:
    """The row's metric for one counter of one port: ``mlx5_0/1/link_downed``."""
    return f"{port.name}/{counter}"


def judge_ib_counters(
    ports: tuple[ib_counters.PortCounters, ...],
    previous: Mapping[tuple[str, str], tuple[float, str]],
    bands: Mapping[str, Band],
    high: Mapping[str, int],
    now: datetime,
) -> list[Verdict]:
    """One row per port and error counter, its value the count read now (the next run's
    baseline). Against the node's previous row of the same metric (``previous``: value and
    ISO time): the growth per hour is judged by ``bands`` (code ``fabric.ib.<counter>_growing``);
    a count that did not grow but reached ``high`` warns (``fabric.ib.counter_high``). A first
    reading, or a count below the previous one (the counters restart at a driver reload or
    reboot), has no rate: only ``high`` applies. A counter the port does not expose is an
    error row (``fabric.ib.counter_missing``); a port whose driver has no PMA ("N/A") skips."""
    out: list[Verdict] = []
    for port in ports:
        for counter in ib_counters.ERROR_COUNTERS:
            metric = counter_metric(port, counter)
            if counter not in port.counters:
                out.append(Verdict(metric, Status.ERROR, CODE_COUNTER_MISSING,
                                   f"{port.name} exposes no counters/{counter}"))
                continue
            value = port.counters[counter]
            if value is None:
                out.append(Verdict(metric, Status.SKIP, "ok",
                                   f"{port.name}: N/A (no PMA): the port keeps no counters"))
                continue
            out.append(_judge_counter(metric, value, previous.get(("fabric.ib_counters",
                                                                    metric)),
                                      bands[counter], high[counter], SATURATED[counter],
                                      GROWING[counter], now))
    return out


def _judge_counter(metric: str, value: int, before: tuple[float, str] | None, band: Band,
                   high: int, saturated_at: int, code: str, now: datetime) -> Verdict:
    limits = f"(warn above {band.warn:g}/h, " if band.warn is not None else "("
    limits += f"fail above {band.fail:g}/h)" if band.fail is not None else "no fail limit)"
    rate_note = ""
    if before is not None:
        then = datetime.fromisoformat(before[1])
        if then.tzinfo is None:
            then = then.replace(tzinfo=UTC)
        hours = max((now - then).total_seconds(), 1.0) / 3600
        grown = value - before[0]
        if grown > 0:
            rate = grown / hours
            status = band.judge(rate)
            return Verdict(metric, status, "ok" if status is Status.PASS else code,
                           f"grew by {grown:g} to {value} in {hours:.2f} h since the previous "
                           f"run: {rate:.3g}/h {limits}", float(value), "count")
        rate_note = ("no growth since the previous run" if grown == 0 else
                     f"below the previous run's {before[0]:g} (counters restarted)")
    else:
        rate_note = "first reading: its growth is judged from the next run"
    if value >= min(high, saturated_at):
        high = min(high, saturated_at)
        stuck = (" (saturated: the counter stops at its maximum and shows no growth any more)"
                 if value >= saturated_at else "")
        return Verdict(metric, Status.WARN, CODE_COUNTER_HIGH,
                       f"{value} (at or above {high}){stuck}; {rate_note}: a past incident, "
                       "clear it once understood", float(value), "count")
    return Verdict(metric, Status.PASS, "ok", rate_note, float(value), "count")


CHECKS: tuple[Check, ...] = (FabricIb(), FabricIbCounters())
