"""Check registry: every check by stable id, in run order (cheap queries first).

``select("gpu.*,nccl.allreduce")`` picks checks by comma-separated ids or shell-style patterns.
"""

from __future__ import annotations

import fnmatch

from validate.checks import dcgm, dcgm_exporter, fabric, gpu, nccl, node, storage
from validate.checks.base import Check, NodeContext, ToolFailure, Verdict
from validate.errors import InputError

REGISTRY: dict[str, Check] = {
    c.id: c
    for c in sorted(
        (*node.CHECKS, *gpu.CHECKS, *fabric.CHECKS, *storage.CHECKS, *nccl.CHECKS,
         *dcgm.CHECKS, *dcgm_exporter.CHECKS),
        key=lambda c: (c.order, c.id),
    )
}


# Checks that run across nodes rather than on each node (id -> title): run after the per-node
# checks, and only when --checks names them (a pair test takes two nodes and minutes).
MULTI_NODE: dict[str, str] = {fabric.PAIR_CHECK_ID: fabric.PAIR_TITLE}


class UnknownCheck(InputError, ValueError):
    """A --checks pattern matched no check."""


def _patterns(spec: str) -> list[str]:
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    known = [*REGISTRY, *MULTI_NODE]
    if not patterns:
        raise UnknownCheck(f"--checks {spec!r} names no check; known: {', '.join(known)}")
    for pattern in patterns:
        if not fnmatch.filter(known, pattern):
            raise UnknownCheck(f"no check matches {pattern!r}; known: {', '.join(known)}")
    return patterns


def select(spec: str | None) -> tuple[Check, ...]:
    """Per-node checks matching ``spec`` (None: all), in run order. A spec that names no check
    (``""``, ``","``) or a pattern that matches none is an :class:`UnknownCheck`: a run of zero
    checks would exit 0 and look like a pass. A spec may name only multi-node checks (see
    :func:`select_multi_node`): then no per-node check is selected. A check named by its exact
    id runs as :meth:`Check.when_named` (an opt-in dcgm.diag level then runs)."""
    if spec is None:
        return tuple(REGISTRY.values())
    patterns = _patterns(spec)
    chosen = {cid for pattern in patterns for cid in fnmatch.filter(REGISTRY, pattern)}
    return tuple(c.when_named() if cid in patterns else c
                 for cid, c in REGISTRY.items() if cid in chosen)


def select_multi_node(spec: str | None) -> tuple[str, ...]:
    """Multi-node check ids that ``spec`` names (None or empty: none, they are opt-in)."""
    if not spec:
        return ()
    chosen = {cid for pattern in _patterns(spec) for cid in fnmatch.filter(MULTI_NODE, pattern)}
    return tuple(cid for cid in MULTI_NODE if cid in chosen)


__all__ = [
    "MULTI_NODE",
    "REGISTRY",
    "Check",
    "NodeContext",
    "ToolFailure",
    "UnknownCheck",
    "Verdict",
    "select",
    "select_multi_node",
]
