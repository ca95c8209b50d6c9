"""The result row, its status vocabulary and the one exit-code table.

A :class:`CheckResult` is one row of the long results table the report is built from (one per
check per node, or several when a check judges several metrics). Columns, in order:

``run_id, time, node, pool, profile, check, metric, value, unit, warn, fail, status, code,
detail, duration_s``

- ``value``/``warn``/``fail`` are floats or ``None`` (a check without a numeric figure).
- ``status`` is a :class:`Status`; ``code`` is a stable fault code (``ok`` when it passes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any


class Status(StrEnum):
    """Outcome of one row, ordered from best to worst by :data:`SEVERITY`."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"
    SKIP = "skip"


# Worst-of ordering used to roll rows up into a node status. skip ranks below pass so that a
# node whose only non-pass rows are skips still counts as passing.
SEVERITY: dict[Status, int] = {
    Status.SKIP: 0,
    Status.PASS: 1,
    Status.WARN: 2,
    Status.FAIL: 3,
    Status.ERROR: 4,
}


def worst(statuses: list[Status]) -> Status:
    """The most severe status in ``statuses`` (``skip`` for an empty list)."""
    return max(statuses, key=SEVERITY.__getitem__, default=Status.SKIP)


# A node's whole validation run: generous for a full suite (NCCL repeats, fio, checkpoint) on a
# healthy node, and what a node stuck in ways no single timeout sees costs at most (``validate
# run --node-deadline``).
DEFAULT_NODE_DEADLINE_S = 3600.0


# The kinds of run a reports root holds (run.json's ``run_kind``): validation, drift and the
# cluster's acceptance through its queues (validate/acceptance.py).
VALIDATION = "validation"
DRIFT = "drift"
ACCEPTANCE = "acceptance"
RUN_KINDS = (VALIDATION, DRIFT, ACCEPTANCE)
# A figure's baseline (validate history, drift's performance layer): the median of the last
# DEFAULT_K passing runs, given at least DEFAULT_MIN_RUNS; a value DEFAULT_MARGIN below it drifted.
DEFAULT_K = 5
DEFAULT_MIN_RUNS = 3
DEFAULT_MARGIN = 0.10


class ExitCode(IntEnum):
    """Process exit codes of ``python -m validate``: the one table."""

    OK = 0  # every check passed (warnings allowed)
    CHECK_FAILED = 1  # at least one check failed
    USAGE_OR_TOOL_ERROR = 2  # bad arguments, or a tool/parse error on some node
    UNREACHABLE = 3  # at least one host could not be reached (or stopped answering)
    INTERRUPTED = 130  # SIGINT/SIGTERM: stopped early, a partial report marked "interrupted"


# What each exit code tells the person reading a report (README.md's exit-code table says the same).
EXIT_MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "all checks pass (warnings allowed)",
    ExitCode.CHECK_FAILED: "a check failed",
    ExitCode.USAGE_OR_TOOL_ERROR: "usage or tool error",
    ExitCode.UNREACHABLE: "unreachable hosts",
    ExitCode.INTERRUPTED: "interrupted (SIGINT/SIGTERM): a partial report",
}


# Codes shared by the framework, the transport and the report.
CODE_OK = "ok"
CODE_UNREACHABLE = "host.unreachable"
CODE_AUTH = "host.auth_failed"
CODE_HOSTKEY = "host.hostkey_rejected"
# The node answered SSH but then stalled (a step of the conversation overran its budget, a
# keepalive went unanswered) or the connection dropped mid-command.
CODE_UNRESPONSIVE = "host.unresponsive"
# The node's overall deadline passed: its remaining checks were not run.
CODE_DEADLINE = "host.deadline"
# SIGINT/SIGTERM stopped the run: the check was cut short or never started.
CODE_INTERRUPTED = "run.interrupted"
CODE_TIMEOUT = "tool.timeout"
CODE_EXIT = "tool.exit_nonzero"
CODE_PARSE = "tool.parse_error"
CODE_NOT_FOUND = "tool.not_found"
# ansible_become is set but `sudo -n` refused a command that needs root (no passwordless right).
CODE_SUDO_DENIED = "tool.sudo_denied"
CODE_INTERNAL = "check.internal_error"
CODE_OUTPUT_LIMIT = "tool.output_too_large"
CODE_NON_FINITE = "check.non_finite_value"
# The tool ran and printed a figure that cannot be a measurement: it moved fewer bytes than it
# was asked to, took less time than the floor, or reports more than the hardware can carry.
CODE_IMPLAUSIBLE = "tool.implausible"
# Codes that mean the node could not be asked (everything it could not answer is unknown).
HOST_CODES = (CODE_UNREACHABLE, CODE_AUTH, CODE_HOSTKEY, CODE_UNRESPONSIVE, CODE_DEADLINE)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of the long results table (see module docstring for the columns)."""

    run_id: str
    time: str  # ISO 8601 UTC, when the check finished
    node: str
    pool: str
    profile: str
    check: str
    metric: str
    value: float | None
    unit: str
    warn: float | None
    fail: float | None
    status: Status
    code: str
    detail: str
    duration_s: float

    def as_dict(self) -> dict[str, Any]:
        """The row as plain data (``status`` as its string value). Every field is a str, a
        float or None, so a shallow dict is the row: ``dataclasses.asdict`` deep-copied each
        value, a tenth of the validator's CPU at 1,000 nodes (py-spy)."""
        row = {name: getattr(self, name) for name in COLUMNS}
        row["status"] = self.status.value
        return row


COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CheckResult))


def exit_code_for(statuses: list[Status], codes: list[str]) -> ExitCode:
    """Exit code for a run: unreachable beats tool error beats a failed check.

    ``statuses`` and ``codes`` are the rows' columns, aligned.
    """
    if any(c in HOST_CODES for c in codes):
        return ExitCode.UNREACHABLE
    if Status.ERROR in statuses:
        return ExitCode.USAGE_OR_TOOL_ERROR
    if Status.FAIL in statuses:
        return ExitCode.CHECK_FAILED
    return ExitCode.OK
