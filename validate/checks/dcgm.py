"""dcgm.diag: NVIDIA DCGM's diagnostics (``dcgmi diag -r N -j``), one row per failed test and GPU.

``dcgm.diag`` runs level 1 (``-r 1``, seconds: deployment checks and a quick PCIe/memory pass)
on every run. ``dcgm.diag_r2`` (minutes) and ``dcgm.diag_r3`` (up to an hour: memory, PCIe
bandwidth, stress, power) run when the profile lists their level in ``thresholds.dcgm.levels``
or when ``--checks`` names them by their exact id; otherwise they are skip rows saying so.
Each level has its own timeout (``thresholds.dcgm.r<N>_timeout_s``).

No level is started on a node with GPU work in progress: DCGM's tests load the GPUs (and
level 1's deployment tests fail on a GPU that runs a process). The check reads
``nvidia-smi --query-compute-apps`` first, as drift does before its heavy checks; any process
makes the row a ``skip`` with code ``dcgm.diag.gpu_busy`` naming the processes.

Each failed test result becomes a ``fail`` row whose metric names the GPU (``gpu3/Error``,
``all/PCIe`` when DCGM judged all GPUs at once), whose code is the stable code of
:func:`validate.parsers.dcgmi_diag.code_for` (memory, pcie, nvlink, thermal_power,
row_remap_pending, row_remap_failed, deployment, compute, other) and whose detail is DCGM's own
message. A warned result is a ``warn`` row with the same codes. With no failure and no warning:
one ``pass`` row counting the results. ``dcgmi`` exits non-zero when a test fails; its output
is judged all the same, and only output that does not parse is a tool failure.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from validate import desired
from validate.checks.base import Check, NodeContext, ToolFailure, Verdict, check_result, parsed
from validate.model import CODE_EXIT, CODE_NOT_FOUND, Status
from validate.parsers import ParseError, dcgmi_diag, nvidia_smi_csv

CODE_GPU_BUSY = "dcgm.diag.gpu_busy"
# Drift's GPU-busy probe (validate/drift/probes.py), the query of the real capture in
# tests/fixtures/nvidia-smi-csv.
COMPUTE_APPS = ("nvidia-smi", "--query-compute-apps=timestamp,gpu_name,gpu_bus_id,gpu_serial,"
                "gpu_uuid,pid,process_name,used_gpu_memory", "--format=csv")
DEFAULT_TIMEOUT_S = {1: 120.0, 2: 900.0, 3: 3600.0}
# The inventory's DCGM pin, the release the nvidia_dcgm role installs: where it is set, a node
# without dcgmi is an error; where it is not, DCGM is not part of the node and the check is a
# skip row saying so.
DCGM_PIN = desired.DCGM_PIN
_GPU = re.compile(r"\bGPU\s*(\d+)\b")
# Every code the check emits (the actions catalogue has one entry per code).
CODES = (
    dcgmi_diag.CODE_MEMORY, dcgmi_diag.CODE_PCIE, dcgmi_diag.CODE_NVLINK,
    dcgmi_diag.CODE_THERMAL_POWER, dcgmi_diag.CODE_ROW_REMAP_PENDING,
    dcgmi_diag.CODE_ROW_REMAP_FAILED, dcgmi_diag.CODE_DEPLOYMENT, dcgmi_diag.CODE_COMPUTE,
    dcgmi_diag.CODE_OTHER, CODE_GPU_BUSY,
)


def diag_argv(level: int) -> tuple[str, ...]:
    return ("dcgmi", "diag", "-r", str(level), "-j")


def busy_detail(ctx: NodeContext) -> str:
    """"" when no process runs on a GPU, else the processes (a ToolFailure when nvidia-smi
    cannot say: the diagnostic is not started then either)."""
    text = ctx.output(COMPUTE_APPS).stdout
    apps = parsed(nvidia_smi_csv.parse_query_compute_apps, text, "nvidia-smi --query-compute-apps")
    if not apps:
        return ""
    shown = ", ".join(f"pid {a.pid} {a.process_name or '?'} on {a.gpu_bus_id or '?'}"
                      for a in apps[:5])
    more = f" (+{len(apps) - 5} more)" if len(apps) > 5 else ""
    return f"not started: GPU work in progress: {shown}{more}"


class DcgmDiag(Check):
    """``dcgmi diag -r <level>``. Level 1 always runs; levels 2 and 3 are opt-in."""

    id = "dcgm.diag"
    title = "DCGM diagnostics level 1 (dcgmi diag -r 1)"
    order = 60
    level: ClassVar[int] = 1

    def __init__(self, *, named: bool = False) -> None:
        self.named = named

    def when_named(self) -> Check:
        return type(self)(named=True)

    def skip_reason(self, ctx: NodeContext) -> str | None:
        if self.level == 1 or self.named:
            return None
        levels = ctx.profile.value("dcgm.levels", list, [1])
        if self.level in levels:
            return None
        return (f"level {self.level} is opt-in: list it in thresholds.dcgm.levels or name "
                f"{self.id} in --checks")

    def prefetch(self, ctx: NodeContext) -> None:
        ctx.prefetch(COMPUTE_APPS)  # beside the gpu.* checks: no round trip of its own

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        busy = busy_detail(ctx)
        if busy:
            return [Verdict("", Status.SKIP, CODE_GPU_BUSY, busy)]
        timeout = ctx.profile.value(f"dcgm.r{self.level}_timeout_s", float,
                                    DEFAULT_TIMEOUT_S[self.level])
        argv = diag_argv(self.level)
        result = ctx.run(argv, timeout, cached=False, tool="dcgmi")
        check_result(result, "dcgmi")
        if result.rc == 127:
            if ctx.node.desired.pins.dcgm_version is None:
                return [Verdict("", Status.SKIP, "ok", f"DCGM is not installed and the "
                                                       f"inventory sets no {DCGM_PIN}")]
            raise ToolFailure(CODE_NOT_FOUND, f"dcgmi: command not found on the node, whose "
                                              f"inventory pins DCGM ({DCGM_PIN})")
        try:
            report = dcgmi_diag.parse(result.stdout)
        except ParseError as exc:
            tail = (result.stderr.strip() or result.stdout.strip())[-300:]
            if result.rc != 0:
                raise ToolFailure(CODE_EXIT, f"dcgmi diag -r {self.level} exited {result.rc}: "
                                             f"{tail}") from None
            raise ToolFailure("tool.parse_error", f"dcgmi diag -r {self.level}: {exc}") from None
        if report.runtime_error:
            # A deployment error DCGM reports instead of results (a pending row remap) is the
            # node's fault, with its code; anything else is the tool's.
            entry = dcgmi_diag.DiagEntry("Deployment", "Error", _gpu_in(report.runtime_error),
                                         "fail", (report.runtime_error,))
            if dcgmi_diag.code_for(entry) in (dcgmi_diag.CODE_DEPLOYMENT, dcgmi_diag.CODE_OTHER):
                raise ToolFailure(CODE_EXIT, f"dcgmi diag -r {self.level}: DCGM reported "
                                             f"{report.runtime_error}")
            report = dataclasses.replace(report, entries=(entry,))
        return judge_diag(report, self.level)


def _gpu_in(text: str) -> int | None:
    """The GPU a DCGM message names ("... GPU 3 ..."), if any."""
    m = _GPU.search(text)
    return int(m.group(1)) if m else None


def judge_diag(report: dcgmi_diag.DiagReport, level: int) -> list[Verdict]:
    """A row per failed or warned result, else one pass row."""
    rows: list[Verdict] = []
    for entry in report.entries:
        if entry.status not in ("fail", "warn"):
            continue
        who = "all" if entry.gpu is None else f"gpu{entry.gpu}"
        where = "all GPUs" if entry.gpu is None else f"GPU {entry.gpu}"
        message = " | ".join(entry.messages) or f"{entry.test}: {entry.status}"
        rows.append(Verdict(
            f"{who}/{entry.test}",
            Status.FAIL if entry.status == "fail" else Status.WARN,
            dcgmi_diag.code_for(entry),
            f"{where}, {entry.category or 'test'} {entry.test!r}: {message}"[:1000],
        ))
    if rows:
        return rows
    judged = [e for e in report.entries if e.status == "pass"]
    if not judged:
        raise ToolFailure(CODE_EXIT, f"dcgmi diag -r {level} ran no test (every result skipped)")
    version = f", DCGM {report.version}" if report.version else ""
    return [Verdict("results_passed", Status.PASS, "ok",
                    f"level {level}: {len(judged)} results pass{version}", float(len(judged)),
                    "count")]


class DcgmDiag2(DcgmDiag):
    id = "dcgm.diag_r2"
    title = "DCGM diagnostics level 2 (dcgmi diag -r 2; opt-in)"
    order = 78
    level = 2


class DcgmDiag3(DcgmDiag):
    id = "dcgm.diag_r3"
    title = "DCGM diagnostics level 3 (dcgmi diag -r 3; opt-in)"
    order = 79
    level = 3


CHECKS: tuple[Check, ...] = (DcgmDiag(), DcgmDiag2(), DcgmDiag3())
