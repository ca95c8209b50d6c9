"""Check registry: every check by stable id, in run order (cheap queries first).

``select("gpu.*,nccl.allreduce")`` picks checks by comma-separated ids or shell-style patterns.
"""

from __future__ import annotations

import fnmatch

from validate.checks import fabric, gpu, nccl, node, storage
from validate.checks.base import Check, NodeContext, ToolFailure, Verdict

REGISTRY: dict[str, Check] = {
    c.id: c
    for c in sorted(
        (*node.CHECKS, *gpu.CHECKS, *fabric.CHECKS, *storage.CHECKS, *nccl.CHECKS),
        key=lambda c: (c.order, c.id),
    )
}


class UnknownCheck(ValueError):
    """A --checks pattern matched no check."""


def select(spec: str | None) -> tuple[Check, ...]:
    """Checks matching ``spec`` (None: all), in run order. A spec that names no check (``""``,
    ``","``) or a pattern that matches none is an :class:`UnknownCheck`: a run of zero checks
    would exit 0 and look like a pass."""
    if spec is None:
        return tuple(REGISTRY.values())
    patterns = [p.strip() for p in spec.split(",") if p.strip()]
    if not patterns:
        raise UnknownCheck(f"--checks {spec!r} names no check; known: {', '.join(REGISTRY)}")
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(REGISTRY, pattern)
        if not hits:
            raise UnknownCheck(f"no check matches {pattern!r}; known: {', '.join(REGISTRY)}")
        chosen.update(hits)
    return tuple(c for cid, c in REGISTRY.items() if cid in chosen)


__all__ = ["REGISTRY", "Check", "NodeContext", "ToolFailure", "UnknownCheck", "Verdict", "select"]
