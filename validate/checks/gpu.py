"""gpu.* checks. One ``nvidia-smi -q -x`` per node serves count, model, memory, driver, ecc,
pcie, persistence and throttle; topology and NVLink use ``topo -m`` and ``nvlink -s``; Xid
events come from the kernel log through journalctl.

Codes: ``gpu.count.missing``/``gpu.count.extra``, ``gpu.model.mismatch``,
``gpu.memory.mismatch``, ``gpu.driver.version_mismatch``/``gpu.driver.not_loaded``,
``gpu.ecc.{uncorrectable,correctable,remap_pending,remap_failure,retired_pending,
mode_disabled,mode_enabled}``,
``gpu.pcie.{degraded,below_spec}``, ``gpu.nvlink.down``, ``gpu.topology.{gpu_count,no_nvlink,
unexpected_nvlink,nic_far}``, ``gpu.persistence.disabled``, ``gpu.xid.<code>``,
``gpu.xid.journal_unreadable`` (an error: journalctl could not read the system journal),
``gpu.throttle.<reason>``, ``gpu.mig.{mode_disabled,mode_enabled,mode_pending,
layout_mismatch}``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping

from validate.checks.base import (
    Check,
    NodeContext,
    ToolFailure,
    Verdict,
    expect_equal,
    judged,
    parsed,
)
from validate.mig import MigLayout
from validate.model import Status, worst
from validate.parsers import (
    nvidia_smi_list,
    nvidia_smi_nvlink,
    nvidia_smi_topo,
    nvidia_smi_xml,
    xid,
)
from validate.parsers.nvidia_smi_model import GpuInfo, NvidiaSmiLog
from validate.profiles import Band
from validate.xid_catalog import lookup

NVSMI_XML = ("nvidia-smi", "-q", "-x")
NVSMI_TOPO = ("nvidia-smi", "topo", "-m")
NVSMI_NVLINK = ("nvidia-smi", "nvlink", "-s")
NVSMI_LIST = ("nvidia-smi", "-L")


def smi_log(ctx: NodeContext) -> NvidiaSmiLog:
    """The node's ``nvidia-smi -q -x``, run once per node per run."""
    return ctx.parsed_output(NVSMI_XML, nvidia_smi_xml.parse, "nvidia-smi -q -x")


def _gpu_label(gpu: GpuInfo) -> str:
    return f"GPU{gpu.index}({gpu.pci_bus_id or '?'})"


class GpuCount(Check):
    id = "gpu.count"
    title = "GPUs visible to the driver"
    order = 10

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        return judge_count(smi_log(ctx), ctx.profile.hardware.gpu_count)


def judge_count(log: NvidiaSmiLog, expected: int) -> list[Verdict]:
    """One row: the number of GPUs nvidia-smi lists against the profile."""
    found = len(log.gpus)
    code = "gpu.count.missing" if found < expected else "gpu.count.extra"
    return [expect_equal("gpu_count", found, expected, code)]


class GpuModel(Check):
    id = "gpu.model"
    title = "GPU product name"
    order = 11

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        return judge_model(smi_log(ctx), ctx.profile.hardware.gpu_model)


def judge_model(log: NvidiaSmiLog, expected: str) -> list[Verdict]:
    """One row: every GPU's product name equals the profile's model."""
    wrong = [f"{_gpu_label(g)}={g.name}" for g in log.gpus if g.name != expected]
    if wrong:
        return [
            Verdict(
                "gpu_model",
                Status.FAIL,
                "gpu.model.mismatch",
                f"expected {expected}: " + ", ".join(wrong),
            )
        ]
    return [Verdict("gpu_model", Status.PASS, "ok", expected)]


class GpuMemory(Check):
    id = "gpu.memory"
    title = "GPU framebuffer size"
    order = 12

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        return judge_memory(smi_log(ctx), ctx.profile.hardware.gpu_memory_mib)


def judge_memory(log: NvidiaSmiLog, expected_mib: int) -> list[Verdict]:
    """One row: smallest FB total (MiB); any GPU differing from the profile fails."""
    totals = [(g, g.memory_total_mib) for g in log.gpus]
    wrong = [f"{_gpu_label(g)}={m}" for g, m in totals if m != expected_mib]
    known = [m for _, m in totals if m is not None]
    value = float(min(known)) if known else None
    if wrong:
        return [
            Verdict(
                "memory_total_mib",
                Status.FAIL,
                "gpu.memory.mismatch",
                f"expected {expected_mib} MiB: " + ", ".join(wrong),
                value,
                "MiB",
            )
        ]
    return [Verdict("memory_total_mib", Status.PASS, "ok", "", value, "MiB")]


class GpuDriver(Check):
    id = "gpu.driver"
    title = "Driver version equals the inventory pin"
    order = 5

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        return judge_driver(smi_log(ctx), ctx.node.desired.pins.driver_version)


def judge_driver(log: NvidiaSmiLog, pin: str | None) -> list[Verdict]:
    """One row: the running driver's version against ``nvidia_driver_version``."""
    if pin is None:
        return [
            Verdict(
                "driver_version",
                Status.SKIP,
                "gpu.driver.no_pin",
                f"nvidia_driver_version not set; running {log.driver_version}",
            )
        ]
    if log.driver_version == pin:
        return [Verdict("driver_version", Status.PASS, "ok", pin)]
    return [
        Verdict(
            "driver_version",
            Status.FAIL,
            "gpu.driver.version_mismatch",
            f"running {log.driver_version}, inventory pins {pin}",
        )
    ]


class GpuEcc(Check):
    id = "gpu.ecc"
    title = "ECC errors, remapped rows, retired pages"
    order = 13

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        bands = {metric: ctx.profile.band(f"ecc.{metric}") for metric, _, _ in _ECC_METRICS}
        expect = ctx.profile.value("ecc.expect_mode", str, "any")
        if expect not in ECC_MODES:
            raise ToolFailure(
                "profile.invalid",
                f"{ctx.profile.source}: thresholds.ecc.expect_mode must be one of "
                f"{', '.join(ECC_MODES)}, got {expect!r}",
            )
        return judge_ecc(smi_log(ctx), bands, expect)


# thresholds.ecc.expect_mode: "enabled" (data-center pools: ECC off hides memory errors, so the
# counters below would pass a GPU that cannot report them), "disabled", or "any" (not judged).
ECC_MODES = ("enabled", "disabled", "any")


_ECC_METRICS: tuple[tuple[str, str, Callable[[GpuInfo], float | None]], ...] = (
    (
        "uncorrectable_volatile",
        "gpu.ecc.uncorrectable",
        lambda g: None if g.ecc is None else g.ecc.volatile_uncorrectable,
    ),
    (
        "correctable_volatile",
        "gpu.ecc.correctable",
        lambda g: None if g.ecc is None else g.ecc.volatile_correctable,
    ),
    (
        "remapped_rows_pending",
        "gpu.ecc.remap_pending",
        lambda g: (
            None
            if g.remapped_rows is None or g.remapped_rows.pending is None
            else float(g.remapped_rows.pending)
        ),
    ),
    (
        "remapped_rows_failure",
        "gpu.ecc.remap_failure",
        lambda g: (
            None
            if g.remapped_rows is None or g.remapped_rows.failure is None
            else float(g.remapped_rows.failure)
        ),
    ),
    (
        "retired_pages_pending",
        "gpu.ecc.retired_pending",
        lambda g: (
            None
            if g.retired_pages is None or g.retired_pages.pending is None
            else float(g.retired_pages.pending)
        ),
    ),
)


def judge_ecc(
    log: NvidiaSmiLog, bands: Mapping[str, Band], expect_mode: str = "any"
) -> list[Verdict]:
    """One row per ECC metric (value = worst GPU); a metric no GPU reports is ``skip``
    (e.g. remapped rows on pre-Ampere GPUs, which retire pages instead). With ``expect_mode``
    "enabled" or "disabled", first an ``ecc_mode`` row (value = GPUs in the other mode; code
    ``gpu.ecc.mode_disabled`` / ``gpu.ecc.mode_enabled``)."""
    out: list[Verdict] = []
    if expect_mode != "any":
        want = expect_mode.capitalize()  # nvidia-smi prints "Enabled" / "Disabled"
        reported = [g for g in log.gpus if g.ecc_mode is not None]
        wrong = [f"{_gpu_label(g)}={g.ecc_mode}" for g in reported if g.ecc_mode != want]
        if not reported:
            out.append(Verdict("ecc_mode", Status.SKIP, "ok", "ECC mode not reported"))
        else:
            out.append(
                Verdict(
                    "ecc_mode",
                    Status.FAIL if wrong else Status.PASS,
                    ("gpu.ecc.mode_disabled" if want == "Enabled" else "gpu.ecc.mode_enabled")
                    if wrong
                    else "ok",
                    f"expected {expect_mode}: " + ", ".join(wrong) if wrong else want,
                    float(len(wrong)),
                    "gpus",
                    None,
                    0.0,
                )
            )
    for metric, code, get in _ECC_METRICS:
        band = bands[metric]
        per_gpu = [(g, get(g)) for g in log.gpus]
        known = [(g, v) for g, v in per_gpu if v is not None]
        if not known:
            out.append(Verdict(metric, Status.SKIP, "ok", "not reported by this GPU/driver"))
            continue
        value = max(v for _, v in known)
        bad = [f"{_gpu_label(g)}={v:g}" for g, v in known if band.judge(v) is not Status.PASS]
        out.append(judged(metric, value, "count", band, code, ", ".join(bad)))
    return out


class GpuPcie(Check):
    id = "gpu.pcie"
    title = "PCIe link at full generation and width"
    order = 14

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        hw = ctx.profile.hardware
        return judge_pcie(smi_log(ctx), hw.pcie_gen, hw.pcie_width)


def judge_pcie(log: NvidiaSmiLog, spec_gen: int, spec_width: int) -> list[Verdict]:
    """Rows ``pcie_width`` and ``pcie_gen`` (value = worst current). Current below the GPU's
    max fails; a max below the profile's spec fails; a gen downshift on an idle GPU only warns,
    since some GPUs lower the link speed at idle."""
    widths: list[str] = []
    gens: list[str] = []
    idle_only = True
    for g in log.gpus:
        if (
            g.pcie_width_current is not None
            and g.pcie_width_max is not None
            and (g.pcie_width_current < g.pcie_width_max or g.pcie_width_max < spec_width)
        ):
            widths.append(f"{_gpu_label(g)} x{g.pcie_width_current}/x{g.pcie_width_max}")
        if (
            g.pcie_gen_current is not None
            and g.pcie_gen_max is not None
            and (g.pcie_gen_current < g.pcie_gen_max or g.pcie_gen_max < spec_gen)
        ):
            gens.append(f"{_gpu_label(g)} gen{g.pcie_gen_current}/gen{g.pcie_gen_max}")
            if "gpu_idle" not in g.clock_event_reasons_active or g.pcie_gen_max < spec_gen:
                idle_only = False
    cur_w = [g.pcie_width_current for g in log.gpus if g.pcie_width_current is not None]
    cur_g = [g.pcie_gen_current for g in log.gpus if g.pcie_gen_current is not None]
    out = [
        Verdict(
            "pcie_width",
            Status.FAIL if widths else Status.PASS,
            "gpu.pcie.degraded" if widths else "ok",
            "; ".join(widths),
            float(min(cur_w)) if cur_w else None,
            "lanes",
            None,
            float(spec_width),
        ),
    ]
    gen_status = Status.PASS if not gens else (Status.WARN if idle_only else Status.FAIL)
    out.append(
        Verdict(
            "pcie_gen",
            gen_status,
            "ok" if not gens else "gpu.pcie.degraded",
            "; ".join(gens) + (" (GPU idle: rerun under load)" if gens and idle_only else ""),
            float(min(cur_g)) if cur_g else None,
            "gen",
            None,
            float(spec_gen),
        )
    )
    return out


class GpuPersistence(Check):
    id = "gpu.persistence"
    title = "Persistence mode enabled"
    order = 15

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        return judge_persistence(smi_log(ctx))


def judge_persistence(log: NvidiaSmiLog) -> list[Verdict]:
    """One row: every GPU in persistence mode (value = GPUs without it)."""
    off = [_gpu_label(g) for g in log.gpus if g.persistence_mode != "Enabled"]
    return [
        Verdict(
            "persistence_disabled_gpus",
            Status.FAIL if off else Status.PASS,
            "gpu.persistence.disabled" if off else "ok",
            ", ".join(off),
            float(len(off)),
            "gpus",
        )
    ]


class GpuThrottle(Check):
    id = "gpu.throttle"
    title = "Active clock event (throttle) reasons"
    order = 16

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        p = ctx.profile
        return judge_throttle(
            smi_log(ctx),
            p.value("throttle.fail_reasons", list),
            p.value("throttle.warn_reasons", list),
        )


def judge_throttle(
    log: NvidiaSmiLog, fail_reasons: list[str], warn_reasons: list[str]
) -> list[Verdict]:
    """One row: worst active reason across GPUs; code ``gpu.throttle.<reason>``."""
    hits: list[tuple[Status, str, str]] = []
    for g in log.gpus:
        for reason in g.clock_event_reasons_active:
            if reason in fail_reasons:
                hits.append((Status.FAIL, reason, _gpu_label(g)))
            elif reason in warn_reasons:
                hits.append((Status.WARN, reason, _gpu_label(g)))
    if not hits:
        return [Verdict("throttle_reasons", Status.PASS, "ok", "", 0.0, "gpus")]
    status = worst([h[0] for h in hits])
    reason = next(h[1] for h in hits if h[0] is status)
    detail = ", ".join(f"{gpu}: {r}" for _, r, gpu in hits)
    gpus = len({h[2] for h in hits})
    return [
        Verdict("throttle_reasons", status, f"gpu.throttle.{reason}", detail, float(gpus), "gpus")
    ]


class GpuMig(Check):
    id = "gpu.mig"
    title = "MIG mode and MIG devices as the pool declares"
    order = 17

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        log = smi_log(ctx)
        layout = ctx.node.desired.mig
        listed = None
        if layout is not None and any(g.mig_mode == "Enabled" for g in log.gpus):
            # -q -x lists MIG devices without their profile names; -L names them.
            text = ctx.output(NVSMI_LIST).stdout
            listed = parsed(nvidia_smi_list.parse, text, "nvidia-smi -L")
        return judge_mig(log, layout, listed)


def judge_mig(log: NvidiaSmiLog, layout: MigLayout | None,
              listed: tuple[nvidia_smi_list.ListedGpu, ...] | None = None) -> list[Verdict]:
    """Rows ``mig_mode`` (value = GPUs in the wrong current MIG mode: Disabled or not
    MIG-capable in a MIG pool, Enabled in any other), ``mig_pending`` (GPUs whose pending mode
    differs from the declared one: a change that a GPU reset would make) and, for a MIG pool,
    ``mig_layout`` (GPUs in MIG mode whose MIG devices, by ``nvidia-smi -L``'s profile names,
    are not the declared ones; order does not matter)."""
    want = "Enabled" if layout is not None else "Disabled"
    wrong: list[str] = []
    pending: list[str] = []
    for g in log.gpus:
        current = g.mig_mode or "not MIG-capable"
        if layout is not None and current != "Enabled":
            wrong.append(f"{_gpu_label(g)}={current}")
        elif layout is None and current == "Enabled":
            wrong.append(f"{_gpu_label(g)}=Enabled ({len(g.mig_devices)} MIG devices)")
        if g.mig_pending is not None and g.mig_pending != want:
            pending.append(f"{_gpu_label(g)} pending {g.mig_pending}")
    mode_code = "gpu.mig.mode_disabled" if layout is not None else "gpu.mig.mode_enabled"
    out = [
        Verdict("mig_mode", Status.FAIL if wrong else Status.PASS,
                mode_code if wrong else "ok",
                f"expected MIG {want.lower()}: " + ", ".join(wrong) if wrong else want,
                float(len(wrong)), "gpus", None, 0.0),
        Verdict("mig_pending", Status.FAIL if pending else Status.PASS,
                "gpu.mig.mode_pending" if pending else "ok",
                ", ".join(pending) + " (takes effect at the GPU's next reset)" if pending else "",
                float(len(pending)), "gpus", None, 0.0),
    ]
    if layout is None:
        return out
    names = {g.index: tuple(m.profile for m in g.mig_devices) for g in listed or ()}
    differ: list[str] = []
    for g in log.gpus:
        if g.mig_mode != "Enabled":
            continue  # said by mig_mode
        declared = layout.for_gpu(g.index)
        found = names.get(g.index, ())
        if declared is None:
            differ.append(f"{_gpu_label(g)}: no layout declared for this GPU, found "
                          f"[{', '.join(found)}]")
        elif sorted(found) != sorted(declared):
            differ.append(f"{_gpu_label(g)}: found [{', '.join(found)}], declared "
                          f"[{', '.join(declared)}]")
    out.append(Verdict("mig_layout", Status.FAIL if differ else Status.PASS,
                       "gpu.mig.layout_mismatch" if differ else "ok", "; ".join(differ),
                       float(len(differ)), "gpus", None, 0.0))
    return out


class GpuNvlink(Check):
    id = "gpu.nvlink"
    title = "Active NVLinks per GPU"
    order = 20

    def skip_reason(self, ctx: NodeContext) -> str | None:
        if ctx.profile.hardware.nvlinks_per_gpu == 0:
            return "profile has no NVLink"
        if ctx.node.desired.mig is not None:
            # "Nvlink queries are not supported for Devices in MIG mode" (real capture:
            # fixtures/nvidia-smi-nvlink/h100-mig-nvlink-s-unsupported.txt).
            return "MIG pool: nvidia-smi answers no NVLink query in MIG mode (gpu.mig judges it)"
        return None

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        text = ctx.output(NVSMI_NVLINK).stdout
        gpus = parsed(nvidia_smi_nvlink.parse, text, "nvidia-smi nvlink -s")
        return judge_nvlink(
            gpus, ctx.profile.hardware.nvlinks_per_gpu, ctx.profile.hardware.gpu_count
        )


def judge_nvlink(
    gpus: tuple[nvidia_smi_nvlink.GpuNvlinks, ...], per_gpu: int, gpu_count: int
) -> list[Verdict]:
    """One row: fewest active links on any GPU, against the profile's links per GPU."""
    if not gpus:
        return [
            Verdict(
                "nvlinks_active_min",
                Status.FAIL,
                "gpu.nvlink.down",
                f"no NVLink reported; expected {per_gpu} per GPU",
                0.0,
                "links",
                None,
                float(per_gpu),
            )
        ]
    short = [
        f"GPU{g.index} {g.active_links}/{per_gpu}" + (f" ({g.status})" if g.status != "ok" else "")
        for g in gpus
        if g.active_links < per_gpu
    ]
    value = float(min(g.active_links for g in gpus))
    if short:
        return [
            Verdict(
                "nvlinks_active_min",
                Status.FAIL,
                "gpu.nvlink.down",
                ", ".join(short),
                value,
                "links",
                None,
                float(per_gpu),
            )
        ]
    return [
        Verdict(
            "nvlinks_active_min",
            Status.PASS,
            "ok",
            f"{len(gpus)} GPUs",
            value,
            "links",
            None,
            float(per_gpu),
        )
    ]


class GpuTopology(Check):
    id = "gpu.topology"
    title = "topo -m matrix matches the pool topology"
    order = 21

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        text = ctx.output(NVSMI_TOPO).stdout
        matrix = parsed(nvidia_smi_topo.parse, text, "nvidia-smi topo -m")
        hw = ctx.profile.hardware
        return judge_topology(matrix, hw.gpu_count, hw.nvlinks_per_gpu > 0, hw.nic_count)


def judge_topology(
    matrix: nvidia_smi_topo.TopoMatrix, gpu_count: int, nvlink: bool, nic_count: int
) -> list[Verdict]:
    """Rows: ``gpus_in_matrix``; ``pairs_without_nvlink`` (NVLink pools: every GPU pair has
    NV#) or ``pairs_with_nvlink`` (PCIe pools: none has); ``gpus_without_near_nic`` for pools
    with RDMA NICs (each GPU should share a PCIe switch, PIX/PXB, with a NIC for GPUDirect)."""
    gpus = matrix.gpus
    out = [expect_equal("gpus_in_matrix", len(gpus), gpu_count, "gpu.topology.gpu_count")]
    pairs = [(a.name, b.name) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    if nvlink:
        missing = [
            f"{a}-{b}:{matrix.link(a, b)}" for a, b in pairs if matrix.nvlink_count(a, b) == 0
        ]
        out.append(
            Verdict(
                "pairs_without_nvlink",
                Status.FAIL if missing else Status.PASS,
                "gpu.topology.no_nvlink" if missing else "ok",
                ", ".join(missing[:8]),
                float(len(missing)),
                "pairs",
            )
        )
    else:
        extra = [f"{a}-{b}" for a, b in pairs if matrix.nvlink_count(a, b) > 0]
        out.append(
            Verdict(
                "pairs_with_nvlink",
                Status.WARN if extra else Status.PASS,
                "gpu.topology.unexpected_nvlink" if extra else "ok",
                ", ".join(extra[:8]),
                float(len(extra)),
                "pairs",
            )
        )
    if nic_count > 0:
        far = [
            g.name
            for g in gpus
            if not any(matrix.link(g.name, n.name) in ("PIX", "PXB") for n in matrix.nics)
        ]
        out.append(
            Verdict(
                "gpus_without_near_nic",
                Status.WARN if far else Status.PASS,
                "gpu.topology.nic_far" if far else "ok",
                ", ".join(far),
                float(len(far)),
                "gpus",
            )
        )
    return out


class GpuXid(Check):
    id = "gpu.xid"
    title = "Xid events in the kernel log"
    order = 30

    @staticmethod
    def _window(ctx: NodeContext) -> str:
        window = ctx.profile.value("xid.window", str)
        return ctx.node.desired.xid_window if ctx.node.desired.xid_window is not None else window

    @staticmethod
    def _argv(window: str) -> tuple[str, ...]:
        return ("journalctl", "--no-pager", "-o", "short-iso", "SYSLOG_IDENTIFIER=kernel",
                "--since", window)

    def prefetch(self, ctx: NodeContext) -> None:
        # The kernel log does not wait for nvidia-smi: on a node whose nvidia-smi hangs it is
        # read in the same timeout, and it is what says why (Xid 79, 119, ...).
        ctx.prefetch(self._argv(self._window(ctx)), root=True)

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        window = self._window(ctx)
        argv = self._argv(window)
        # The system journal (kernel messages included) is readable by root and a few groups
        # only: a login user without them would read an empty log and pass.
        result = ctx.output(argv, root=True)
        unreadable = _JOURNAL_UNREADABLE.search(result.stderr)
        if unreadable:
            # journalctl exits 0 and prints "-- No entries --" when it may not read the system
            # journal or there is none: an empty log read that way is no evidence of health.
            raise ToolFailure(CODE_JOURNAL_UNREADABLE,
                              f"journalctl read no kernel log: {unreadable.group(0).strip()}")
        events = parsed(xid.parse, result.stdout, "journalctl (kernel log)")
        p = ctx.profile
        return judge_xid(
            events,
            window,
            p.value("xid.fail_codes", list),
            p.value("xid.warn_codes", list),
            p.value("xid.ignore_codes", list),
            p.value("xid.severity_status", dict),
        )


# journalctl's stderr when it could not read the system journal (real messages: systemd's
# journalctl without journal files, and as a user outside the adm/systemd-journal groups).
_JOURNAL_UNREADABLE = re.compile(
    r"No journal files were (?:found|opened)[^\n]*|"
    r"You are currently not seeing messages from other users and the system[^\n]*")
CODE_JOURNAL_UNREADABLE = "gpu.xid.journal_unreadable"


def judge_xid(
    events: tuple[xid.XidEvent, ...],
    window: str,
    fail_codes: list[int],
    warn_codes: list[int],
    ignore_codes: list[int],
    severity_status: dict[str, str],
) -> list[Verdict]:
    """One row per distinct Xid code (value = events, detail = GPUs, meaning and action), or
    one passing ``xid_events`` row when the window holds none."""
    if not events:
        return [Verdict("xid_events", Status.PASS, "ok", f"none since {window}", 0.0, "events")]
    counts = Counter(e.xid for e in events)
    out: list[Verdict] = []
    for code in sorted(counts):
        info = lookup(code)
        if code in ignore_codes:
            status = Status.PASS
        elif code in fail_codes:
            status = Status.FAIL
        elif code in warn_codes:
            status = Status.WARN
        else:
            status = Status(severity_status.get(info.severity, "warn"))
        buses = sorted({e.pci_bus_id for e in events if e.xid == code})
        detail = f"{info.severity}: {info.summary} on {', '.join(buses)}; action: {info.action}"
        out.append(
            Verdict(
                f"xid_{code}",
                status,
                "ok" if status is Status.PASS else f"gpu.xid.{code}",
                detail,
                float(counts[code]),
                "events",
            )
        )
    return out


CHECKS: tuple[Check, ...] = (
    GpuDriver(),
    GpuCount(),
    GpuModel(),
    GpuMemory(),
    GpuEcc(),
    GpuPcie(),
    GpuPersistence(),
    GpuThrottle(),
    GpuMig(),
    GpuNvlink(),
    GpuTopology(),
    GpuXid(),
)
