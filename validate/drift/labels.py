"""Labels and taints layer: what the gate would set on a node against its Node object.

The gate (validate/gate.py) decides a node's labels, taints and annotations from its identity
(pool) and its latest results. Until it lands this layer is **not available**: every node gets
one ``unavailable`` finding saying so, never a pass. When it lands, its decision function is
passed in as ``desired`` (:data:`DesiredMetadata`), and :func:`compare` runs against the Node
read with the kubernetes client (:func:`read_node_metadata`).

Only keys under the site's label prefix are compared for labels and annotations (other
controllers own the rest, e.g. GPU Feature Discovery's ``nvidia.com/*``); taints are compared
by key for the keys the gate manages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

from validate.drift.model import Finding, FindingStatus, Layer
from validate.inventory import Node

NOT_AVAILABLE = (
    "labels and taints are not compared yet: the gate (validate/gate.py) that decides them "
    "has not landed"
)


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else \
            f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class NodeMetadata:
    """Labels, taints and annotations of a node (desired or actual). ``prefix`` is the label
    prefix the desired side manages (``gpuready.example.com/``); ``taint_keys`` the taints."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    taint_keys: frozenset[str] = frozenset()


# node identity + its latest result rows (long format) -> what the gate would set.
DesiredMetadata = Callable[[Node, pd.DataFrame], NodeMetadata]


def metadata_from_object(obj: Mapping[str, Any]) -> NodeMetadata:
    """A Node object (as the API returns it, ``to_dict()`` of the client's V1Node or JSON)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
    )
    return NodeMetadata(dict(meta.get("labels") or {}), taints,
                        dict(meta.get("annotations") or {}))


def read_node_metadata(api: Any, name: str) -> NodeMetadata:
    """Read the Node with a ``kubernetes.client.CoreV1Api`` (one GET, nothing written)."""
    node = api.read_node(name)
    client = api.api_client
    return metadata_from_object(client.sanitize_for_serialization(node))


def compare(node: Node, desired: NodeMetadata, actual: NodeMetadata) -> list[Finding]:
    """Findings for every managed label, annotation and taint that differs."""
    out: list[Finding] = []

    def add(item: str, want: str, have: str) -> None:
        out.append(Finding(node.name, node.pool, Layer.LABELS, item, want, have,
                           FindingStatus.DRIFT, "", "probe: Node object"))

    for kind, want_map, have_map in (("label", desired.labels, actual.labels),
                                     ("annotation", desired.annotations, actual.annotations)):
        managed = {k for k in have_map if desired.prefix and k.startswith(desired.prefix)}
        for key in sorted(set(want_map) | managed):
            want, have = want_map.get(key), have_map.get(key)
            if want != have:
                add(f"{kind} {key}", "absent" if want is None else want,
                    "absent" if have is None else have)
    keys = set(desired.taint_keys) | {t.key for t in desired.taints}
    for key in sorted(keys):
        want_t = sorted(str(t) for t in desired.taints if t.key == key)
        have_t = sorted(str(t) for t in actual.taints if t.key == key)
        if want_t != have_t:
            add(f"taint {key}", ", ".join(want_t) or "absent", ", ".join(have_t) or "absent")
    return out


def layer(nodes: Sequence[Node], desired: DesiredMetadata | None = None,
          latest: pd.DataFrame | None = None,
          read: Callable[[str], NodeMetadata] | None = None) -> list[Finding]:
    """The labels layer for ``nodes``: unavailable until a ``desired`` function and a Node
    ``read`` function are given."""
    if desired is None or read is None:
        return [Finding(n.name, n.pool, Layer.LABELS, "labels and taints", "(gate)",
                        "not compared", FindingStatus.UNAVAILABLE, NOT_AVAILABLE, "labels")
                for n in nodes]
    rows = latest if latest is not None else pd.DataFrame()
    out: list[Finding] = []
    for n in nodes:
        mine = rows[rows["node"] == n.name] if not rows.empty else rows
        try:
            actual = read(n.name)
        except Exception as exc:  # an API error must not stop the other nodes
            out.append(Finding(n.name, n.pool, Layer.LABELS, "Node object", "readable",
                               type(exc).__name__, FindingStatus.ERROR, str(exc)[:300],
                               "probe: Node object"))
            continue
        out += compare(n, desired(n, mine), actual)
    return out
