"""What a drift run finds: one :class:`Finding` per node, layer and item.

A finding's ``status`` says what kind of news it is:

- ``drift``: the node differs from what the inventory declares (exit code 1);
- ``skipped``: the item was deliberately not checked (a heavy test on a node with GPU work, a
  figure with too little history), with the reason in ``detail``;
- ``unavailable``: the layer could not be compared (labels and taints with no Kubernetes API
  or kubeconfig, a node no validation run covers): the run is incomplete, exit code 2 (unless
  ``--layers`` left the layer out, when it is not asked at all);
- ``error``: a probe or the check-mode run could not answer (exit code 2);
- ``unreachable``: the node could not be reached at all, or stopped answering (exit code 3);
- ``note``: not drift, a fact the node's findings are read with: an operator's release of its
  quarantine that the gate's decision honours (item ``release``: who, when, why); it does not
  change the code.

An interrupted run (SIGINT/SIGTERM) exits 130 whatever it found (validate/drift/run.py).

Items are named the same way by every source that can see them, so a service that check mode
would start and that ``systemctl is-active`` calls inactive is one finding, not two:

========================  =================================================================
layer                     items
========================  =================================================================
configuration             a managed path (``/etc/sysctl.d/90-gpuready.conf``), else
                          ``<role>: <task>``
versions                  ``kernel``, ``driver module``, ``driver library``,
                          ``driver module/library``, ``package <name>``, ``hold <name>``
runtime                   ``service <unit>``, ``persistence mode``, ``module <name>``,
                          ``containerd runtime <name>``
labels                    ``label <key>``, ``taint <key>``, ``annotation <key>``,
                          ``release`` (a note)
performance               ``<check> <metric>`` (``nccl.allreduce busbw_gbps``)
========================  =================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from validate.model import ExitCode

# Seconds one check-mode task may take on one node before the node is given up (the per-node
# deadline of the pass). Check mode reads state and simulates; on a loaded control node a task
# of a large fleet still takes seconds, not minutes.
DEFAULT_TASK_TIMEOUT_S = 120
# The performance layer's checks by default.
DEFAULT_CHECKS = "gpu.pcie,nccl.allreduce,storage.fio"
# All of one node's probes and performance checks; a healthy node's take seconds to a few
# minutes (NCCL and fio at their fixed sizes).
DEFAULT_NODE_DEADLINE_S = 900.0


class Layer(StrEnum):
    """Where a node can drift, in the order reports list them."""

    CONFIGURATION = "configuration"
    VERSIONS = "versions"
    RUNTIME = "runtime"
    LABELS = "labels"
    PERFORMANCE = "performance"


class FindingStatus(StrEnum):
    """What kind of news a finding is (module docstring)."""

    DRIFT = "drift"
    SKIPPED = "skipped"
    UNAVAILABLE = "unavailable"
    ERROR = "error"
    UNREACHABLE = "unreachable"
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Finding:
    """One row of the drift table (``since`` is added from history when the run is written).

    ``declared``/``actual`` are short human strings; ``detail`` carries the diff or the reason;
    ``source`` says which probe or check-mode task saw it."""

    node: str
    pool: str
    layer: Layer
    item: str
    declared: str
    actual: str
    status: FindingStatus = FindingStatus.DRIFT
    detail: str = ""
    source: str = ""

    @property
    def key(self) -> tuple[str, Layer, str]:
        return (self.node, self.layer, self.item)

    def as_dict(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["layer"] = self.layer.value
        row["status"] = self.status.value
        return row


COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Finding))


def merged(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (node, layer, item): the first seen keeps its declared/actual (probes
    are passed first, so a live reading wins over check mode's), later sources add to
    ``source`` and, when the first had none, ``detail``; the worse status stays."""
    by_key: dict[tuple[str, Layer, str], Finding] = {}
    for f in findings:
        seen = by_key.get(f.key)
        if seen is None:
            by_key[f.key] = f
            continue
        status = max(seen.status, f.status, key=_RANK.__getitem__)
        sources = "; ".join(s for s in dict.fromkeys((seen.source, f.source)) if s)
        by_key[f.key] = dataclasses.replace(
            seen, status=status, source=sources, detail=seen.detail or f.detail
        )
    return sorted(by_key.values(), key=lambda f: (f.node, list(Layer).index(f.layer), f.item))


_RANK = {
    FindingStatus.NOTE: 0,
    FindingStatus.SKIPPED: 0,
    FindingStatus.UNAVAILABLE: 1,
    FindingStatus.DRIFT: 2,
    FindingStatus.ERROR: 3,
    FindingStatus.UNREACHABLE: 4,
}


def exit_code(findings: Sequence[Finding]) -> ExitCode:
    """The one exit-code table, applied to a drift run: unreachable (3) beats incomplete (a
    tool error or a layer that could not be compared: 2) beats drift (``CHECK_FAILED``, 1);
    skipped items and notes do not change the code."""
    statuses = {f.status for f in findings}
    if FindingStatus.UNREACHABLE in statuses:
        return ExitCode.UNREACHABLE
    if statuses & {FindingStatus.ERROR, FindingStatus.UNAVAILABLE}:
        return ExitCode.USAGE_OR_TOOL_ERROR
    if FindingStatus.DRIFT in statuses:
        return ExitCode.CHECK_FAILED
    return ExitCode.OK
