"""Labels and taints layer: what the gate would change on each node's Node object.

The gate (validate/gate.py) decides a node's labels, taint and annotations under the site's
prefix with one pure function, :func:`validate.labels.decide`, from the node's declared
identity, what a validation run holds about it (validate/evidence.py) and its Node.
This layer asks that same decision (:func:`validate.gate.decision_for`, with the node's own
freshness window and taint effect) for every node, against the Node as the API server has it
(one list with the official ``kubernetes`` client, read as the gate reads it), and reports each
change the gate would make as a finding:

========================  ==================================================================
item                      ``label <key>``, ``annotation <key>``, ``taint <key>``
declared                  what the gate would set (``absent``: it would remove it)
actual                    what the Node carries (``absent``: nothing)
========================  ==================================================================

A node an operator released from quarantine (``validate gate --release``) is judged as the
gate judges it after the release: evidence measured before the release does not quarantine it
again (validate/labels.py), and while the decision rests on such evidence the node's findings
come with a ``note`` (item ``release``, actual ``released by <who> at <when>``, detail: why,
the codes lifted and the run that found them), so the console shows the release on the node's
line.

A GPU node of the inventory with no Node is ``Node object``: declared ``registered``, actual
``absent``. Only the gate's keys are compared; labels of other owners (GPU Feature Discovery's
``nvidia.com/*``, the kubelet's) are the gate's input, never drift.

The run a node is judged from is the newest validation run (not a drift run,
validate/runinfo.py's ``run_kind``) under the history roots that has rows for it, read with the
gate's own reader. Every rule of the gate applies: freshness (``gpuready_gate_max_run_age``),
completeness, finite values, quarantine, the failed taint and its effect, ``last-run``.

Not compared (``unavailable``, one finding per node, item ``labels and taints``, actual
``not compared: <why>``):

- ``no validation run``: no validation run under the history roots holds the node;
- ``held (<codes>)``: the gate would leave the Node as it is (a run older than the pool's
  window, one that cannot admit a passing node, one older than the run that last judged the
  Node: ``gate.stale_run``, ``gate.incomplete_run``, ``gate.non_finite_value``,
  ``gate.superseded_run``). Comparing the Node with itself would always say "no drift", so the
  layer says it did not look;
- the whole layer (no label prefix, no kubeconfig or one that does not load, an API server
  that cannot be reached or refuses): every node gets the finding with that reason, and
  :attr:`LabelsLayer.unavailable` says it once for the console.

Any of these makes the run incomplete (exit 2, validate/drift/model.py) unless ``--layers`` left
the labels layer out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import pyarrow.parquet as pq

from validate import gate, runinfo
from validate.drift.model import Finding, FindingStatus, Layer
from validate.evidence import EmptyRun, read_run
from validate.inventory import Node
from validate.labels import (
    CODE_INCOMPLETE,
    CODE_NON_FINITE,
    CODE_STALE,
    CODE_SUPERSEDED,
    IdentityError,
    plan_node,
)
from validate.model import VALIDATION
from validate.profiles import ProfileError
from validate.results import LATEST, PARTIAL_SUFFIX, ResultsError

ITEM = "labels and taints"
RELEASE_ITEM = "release"
SOURCE = "gate decision vs Node (API server)"
DECLARED = "compared with the gate"
NOT_COMPARED = "not compared"
RESULTS_FILES = ("results.parquet", "results.csv")
# What to do about a node the gate holds, by the code that holds it.
_HINTS = {
    CODE_STALE: "validate the node again (python -m validate run)",
    CODE_INCOMPLETE: "validate the node again with every check (python -m validate run "
                     "without --checks)",
    CODE_NON_FINITE: "the results file is damaged: validate the node again",
    CODE_SUPERSEDED: "a newer run than any under the history roots judged the Node: point "
                     "--history at the reports the gate reads",
}


@dataclass
class LabelsLayer:
    """The layer's findings; ``unavailable`` is why it could not be compared at all ("" when
    it was)."""

    findings: list[Finding] = field(default_factory=list)
    unavailable: str = ""


def _started(run_dir: Path, results: Path) -> str:
    """When the run started (run.json), else when its results were written: run ids given with
    --run-id need not sort by time."""
    try:
        doc = json.loads((run_dir / runinfo.RUN_INFO_FILE).read_text(encoding="utf-8"))
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
                if results is None or runinfo.run_kind(run_dir) != VALIDATION:
                    continue
                found[entry.name] = (_started(run_dir, results), entry.name, run_dir)
    # Runs started in the same second: the run id decides (default ids sort by time).
    return [path for *_, path in sorted(found.values(), reverse=True)]


def _nodes_in(run_dir: Path) -> set[str] | None:
    """The nodes a run has rows for, from the Parquet file's one column (None: no Parquet
    file, read the run to know)."""
    parquet = run_dir / "results.parquet"
    if not parquet.is_file():
        return None
    return {str(v) for v in pq.read_table(parquet, columns=["node"]).column("node").to_pylist()}


def latest_rows(roots: Iterable[Path], names: Sequence[str]
                ) -> dict[str, tuple[str, pd.DataFrame]]:
    """Per node, its newest validation run's id and its rows there (the gate's reader)."""
    wanted = set(names)
    out: dict[str, tuple[str, pd.DataFrame]] = {}
    for run_dir in validation_runs(roots):
        left = wanted - set(out)
        if not left:
            break
        try:
            present = _nodes_in(run_dir)
            if present is not None and not present & left:
                continue
            run = read_run(run_dir)
        except (OSError, ValueError, ResultsError, EmptyRun):
            continue  # a damaged or empty run is not evidence; an older one may be
        for name, rows in run.rows.groupby("node", sort=True):
            if str(name) in left:
                out[str(name)] = (run.run_id, rows)
    return out


def unavailable_findings(nodes: Sequence[Node], why: str) -> list[Finding]:
    """One ``unavailable`` finding per node: the layer was not compared, for ``why``."""
    return [Finding(n.name, n.pool, Layer.LABELS, ITEM, DECLARED, NOT_COMPARED,
                    FindingStatus.UNAVAILABLE, why, "labels") for n in nodes]


def _unavailable(nodes: Sequence[Node], why: str) -> LabelsLayer:
    return LabelsLayer(unavailable_findings(nodes, why), why)


def layer(nodes: Sequence[Node], roots: Sequence[Path], *, kubeconfig: Path | None = None,
          api_factory: Callable[[Path | None], gate.NodeApi] = gate.KubeNodeApi,
          now: datetime | None = None) -> LabelsLayer:
    """The labels layer for ``nodes``, judged from the validation runs under ``roots`` at
    ``now`` (default: the current time; the gate's freshness window counts from it)."""
    try:
        setup = gate.setup_for(nodes, kubeconfig=kubeconfig)
    except (gate.GateError, ValueError) as exc:
        return _unavailable(nodes, f"the gate's settings: {exc}")
    runs = latest_rows(roots, [n.name for n in nodes])
    try:
        api = api_factory(setup.kubeconfig)
        objects: Mapping[str, Mapping[str, object]] = {
            str(o["metadata"]["name"]): o for o in api.list_nodes()}
    except gate.GateError as exc:
        return _unavailable(nodes, str(exc))
    when = now or datetime.now(UTC)
    out = LabelsLayer()
    where = ", ".join(str(r) for r in roots)
    for node in nodes:
        def add(item: str, declared: str, actual: str, status: FindingStatus,
                detail: str, node: Node = node) -> None:
            out.findings.append(Finding(node.name, node.pool, Layer.LABELS, item, declared,
                                        actual, status, detail, SOURCE))

        found = runs.get(node.name)
        if found is None:
            add(ITEM, DECLARED, f"{NOT_COMPARED}: no validation run", FindingStatus.UNAVAILABLE,
                f"no validation run of this node under {where}: the gate has nothing to decide "
                "from (run `python -m validate run`, or point --history at its reports)")
            continue
        run_id, rows = found
        name = node.desired.gate.node_name or node.name
        obj = objects.get(name)
        try:
            wanted = gate.decision_for(node, rows, run_id, obj, setup.prefix, now=when)
        except (ProfileError, IdentityError) as exc:
            add(ITEM, DECLARED, NOT_COMPARED, FindingStatus.ERROR, str(exc))
            continue
        if wanted.hold:
            codes = ", ".join(wanted.codes)
            hints = list(dict.fromkeys(_HINTS[c] for c in wanted.codes if c in _HINTS))
            add(ITEM, DECLARED, f"{NOT_COMPARED}: held ({codes})", FindingStatus.UNAVAILABLE,
                f"the gate would leave the Node as it is on run {run_id} (held: {codes}): "
                + "; ".join(wanted.reasons)
                + ". Drift compares the Node only with a decision the gate would act on, so its "
                "labels and taints are not watched until it has one"
                + (f" ({'; '.join(hints)})" if hints else ""))
            continue
        if obj is None:
            add("Node object", "registered", "absent", FindingStatus.DRIFT,
                f"no Node named {name} in the cluster at {api.server} (has it joined?)")
            continue
        plan = plan_node(obj, wanted, setup.prefix)
        why = (f"the gate decides {wanted.verdict} from run {run_id}"
               + (f" ({', '.join(wanted.codes)})" if wanted.codes else ""))
        if wanted.released is not None:
            r = wanted.released
            why += f", after the release by {r.by or '?'} at {r.at or '?'}"
            add(RELEASE_ITEM, "", f"released by {r.by or '?'} at {r.at or '?'}",
                FindingStatus.NOTE,
                f"{r.reason or '?'} (quarantine for {', '.join(r.codes) or '?'} found by run "
                f"{r.run or '?'} lifted; the gate judges run {run_id}, measured before the "
                f"release, as {wanted.verdict}"
                + ("" if wanted.verdict == "passed"
                   else ": out until a run admits it") + ")")
        for change in plan.changes:
            add(f"{change.kind} {change.key}", change.new or "absent", change.old or "absent",
                FindingStatus.DRIFT, why)
    return out
