"""Labels and taints layer: what the gate would change on each node's Node object.

The gate (validate/gate.py) decides a node's labels, taint and annotations under the site's
prefix from its declared identity and its latest validation run. This layer asks the gate's
own decision function (:func:`validate.gate.decide`) for every node, against the Node as the
API server has it (one list with the official ``kubernetes`` client, read as the gate reads
it), and reports each change the gate would make as a finding:

========================  ==================================================================
item                      ``label <key>``, ``annotation <key>``, ``taint <key>``
declared                  what the gate would set (``absent``: it would remove it)
actual                    what the Node carries (``absent``: nothing)
========================  ==================================================================

A GPU node of the inventory with no Node is ``Node object``: declared ``registered``, actual
``absent``. Only the gate's keys are compared; labels of other owners (GPU Feature Discovery's
``nvidia.com/*``, the kubelet's) are the gate's input, never drift.

The run a node is judged from is the newest validation run (not a drift run) under the
history roots that has rows for it, read with the gate's own reader; a node no validation run
covers cannot be compared (``unavailable``: the gate has nothing to decide from).

When the layer cannot be compared at all (no label prefix, no kubeconfig or one that does not
load, an API server that cannot be reached or refuses) every node gets one ``unavailable``
finding saying why, and :attr:`LabelsLayer.unavailable` says it once for the console. An
unavailable layer makes the run incomplete (exit 2, validate/drift/model.py) unless
``--layers`` left it out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from validate import gate
from validate.drift.model import Finding, FindingStatus, Layer
from validate.inventory import Node
from validate.labels import IdentityError, NodeResults
from validate.profiles import ProfileError
from validate.report import LATEST, PARTIAL_SUFFIX
from validate.runinfo import RUN_INFO_FILE, RUN_KIND_VALIDATION

ITEM = "labels and taints"
SOURCE = "gate decision vs Node (API server)"
DRIFT_META = "drift.json"
RESULTS_FILES = ("results.parquet", "results.csv")


@dataclass
class LabelsLayer:
    """The layer's findings; ``unavailable`` is why it could not be compared at all ("" when
    it was)."""

    findings: list[Finding] = field(default_factory=list)
    unavailable: str = ""


def _run_kind(run_dir: Path) -> str:
    if (run_dir / DRIFT_META).is_file():
        return "drift"
    try:
        doc = json.loads((run_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return RUN_KIND_VALIDATION  # written before run.json: a validation run
    kind = doc.get("run_kind", RUN_KIND_VALIDATION) if isinstance(doc, dict) else None
    return str(kind)


def _started(run_dir: Path, results: Path) -> str:
    """When the run started (run.json), else when its results were written: run ids given with
    --run-id need not sort by time."""
    try:
        doc = json.loads((run_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
        if isinstance(doc, dict) and isinstance(doc.get("started"), str):
            return str(doc["started"])
    except (OSError, ValueError):
        pass
    return datetime.fromtimestamp(results.stat().st_mtime, UTC).isoformat(timespec="seconds")


def validation_runs(roots: Iterable[Path]) -> list[Path]:
    """The finished validation runs (not drift runs) directly under ``roots``, newest first."""
    found: dict[str, tuple[str, str, Path]] = {}
    for root in roots:
        if not root.is_dir():
            continue
        with os.scandir(root) as entries:
            for entry in entries:
                if (entry.name.startswith(".") or entry.name.endswith(PARTIAL_SUFFIX)
                        or entry.name == LATEST or entry.is_symlink()
                        or not entry.is_dir(follow_symlinks=False) or entry.name in found):
                    continue
                run_dir = Path(entry.path)
                results = next((run_dir / f for f in RESULTS_FILES
                                if (run_dir / f).is_file()), None)
                if results is None or _run_kind(run_dir) != RUN_KIND_VALIDATION:
                    continue
                found[entry.name] = (_started(run_dir, results), entry.name, run_dir)
    # Runs started in the same second: the run id decides (default ids sort by time).
    return [path for *_, path in sorted(found.values(), reverse=True)]


def _nodes_in(run_dir: Path) -> set[str]:
    parquet = run_dir / "results.parquet"
    if parquet.is_file():
        column = pq.read_table(parquet, columns=["node"]).column("node")
        return {str(v) for v in column.to_pylist()}
    return set(gate.run_results(run_dir))


def latest_results(roots: Iterable[Path], names: Sequence[str]
                   ) -> dict[str, NodeResults]:
    """Per node, what its newest validation run says (the gate's own reader)."""
    wanted = set(names)
    out: dict[str, NodeResults] = {}
    for run_dir in validation_runs(roots):
        if not wanted - set(out):
            break
        try:
            if not (_nodes_in(run_dir) & (wanted - set(out))):
                continue
            results = gate.run_results(run_dir)
        except (OSError, ValueError, gate.GateError):
            continue  # a damaged run is not evidence; an older one may be
        for name in wanted - set(out):
            if name in results:
                out[name] = results[name]
    return out


def unavailable_findings(nodes: Sequence[Node], why: str) -> list[Finding]:
    """One ``unavailable`` finding per node: the layer was not compared, for ``why``."""
    return [Finding(n.name, n.pool, Layer.LABELS, ITEM, "compared with the gate",
                    "not compared", FindingStatus.UNAVAILABLE, why, "labels") for n in nodes]


def _unavailable(nodes: Sequence[Node], why: str) -> LabelsLayer:
    return LabelsLayer(unavailable_findings(nodes, why), why)


def layer(nodes: Sequence[Node], roots: Sequence[Path], *, kubeconfig: Path | None = None,
          api_factory: Callable[[Path | None], gate.NodeApi] = gate.KubeNodeApi
          ) -> LabelsLayer:
    """The labels layer for ``nodes``, judged from the validation runs under ``roots``."""
    try:
        prefix, config = gate.inventory_settings(nodes, kubeconfig=kubeconfig)
    except (gate.GateError, ValueError) as exc:
        return _unavailable(nodes, f"the gate's settings: {exc}")
    results = latest_results(roots, [n.name for n in nodes])
    try:
        api = api_factory(config)
        objects: Mapping[str, Mapping[str, object]] = {
            str(o["metadata"]["name"]): o for o in api.list_nodes()}
    except gate.GateError as exc:
        return _unavailable(nodes, str(exc))
    out = LabelsLayer()
    where = ", ".join(str(r) for r in roots)
    for node in nodes:
        def add(item: str, declared: str, actual: str, status: FindingStatus,
                detail: str, node: Node = node) -> None:
            out.findings.append(Finding(node.name, node.pool, Layer.LABELS, item, declared,
                                        actual, status, detail, SOURCE))

        result = results.get(node.name)
        if result is None:
            add(ITEM, "compared with the gate", "not compared", FindingStatus.UNAVAILABLE,
                f"no validation run of this node under {where}: the gate has nothing to decide "
                "from (run `python -m validate run`, or point --history at its reports)")
            continue
        try:
            identity = gate.identity_of(node)
        except ProfileError as exc:
            add(ITEM, "compared with the gate", "not compared", FindingStatus.ERROR, str(exc))
            continue
        obj = objects.get(identity.name)
        if obj is None:
            add("Node object", "registered", "absent", FindingStatus.DRIFT,
                f"no Node named {identity.name} in the cluster at {api.server} (has it "
                "joined?)")
            continue
        try:
            wanted, plan = gate.decide(obj, identity, result, prefix)
        except IdentityError as exc:
            add(ITEM, "compared with the gate", "not compared", FindingStatus.ERROR, str(exc))
            continue
        why = (f"the gate decides {wanted.verdict} from run {result.run_id}"
               + (f" ({', '.join(wanted.codes)})" if wanted.codes else ""))
        for change in plan.changes:
            add(f"{change.kind} {change.key}", change.new or "absent", change.old or "absent",
                FindingStatus.DRIFT, why)
    return out
