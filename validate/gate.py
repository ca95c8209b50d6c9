"""``python -m validate gate``: label and admit the inventory's nodes from a validation run.

    python -m validate gate -i <inventory> [--run <run-dir>] [--limit PATTERN] [--dry-run]
                            [--kubeconfig FILE] [--prefix DOMAIN]

For every inventory node the run validated, the gate computes what the node should carry
(validate/labels.py) and reconciles the Node with the official ``kubernetes`` client: one list
of the Nodes, then one JSON merge patch per Node that needs a change, guarded by the
``resourceVersion`` the list returned. On 409 Conflict (the kubelet or someone else wrote in
between) it reads that Node again and recomputes, up to ``MAX_ATTEMPTS`` times. A Node already
right gets no request at all.

Every change (label, taint, annotation: old -> new) is printed per node and written to
``<run-dir>/gate.json``; ``--dry-run`` prints the same plan and changes nothing (it writes no
file either). The kubeconfig is ``--kubeconfig``, else the inventory's ``gpuready_kubeconfig``,
else ``KUBECONFIG`` / ``~/.kube/config``; the prefix is ``--prefix``, else
``gpuready_label_prefix``.

Exit codes (validate/model.py's table): 0 every gated node passed and carries what it should;
1 a node failed validation or the gate (it stays tainted) or is not registered; 2 usage or tool
error: bad input, no run, or an API that cannot be reached or refuses (nothing was changed on a
node the gate could not judge; an unreachable API means nothing was changed at all).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned
import urllib3

from validate import desired
from validate.inventory import InventoryError, Node, load, profile_for
from validate.labels import (
    CODE_NOT_REGISTERED,
    FAILED,
    PASSED,
    Desired,
    IdentityError,
    NodeIdentity,
    NodePlan,
    NodeResults,
    check_prefix,
    desired_state,
    gfd_of,
    plan_node,
)
from validate.model import CODE_OK, ExitCode, Status, worst
from validate.profiles import ProfileError
from validate.report import load_results

MAX_ATTEMPTS = 5
MERGE_PATCH = "application/merge-patch+json"
REPORT_FILE = "gate.json"
# Verdicts of a node in the gate's report, besides passed/failed.
NOT_REGISTERED = "not-registered"
ERROR = "error"


class GateError(Exception):
    """The gate cannot do its work (exit 2); the message says why."""


class ApiUnavailable(GateError):
    """The API server cannot be reached, or refuses the gate's credentials."""


class Conflict(Exception):
    """409: the Node changed since it was read."""


class NotFound(Exception):
    """404: no such Node."""


class NodeApi(Protocol):
    """What the gate needs from the Kubernetes API."""

    server: str
    calls: Counter[str]

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...


class KubeNodeApi:
    """:class:`NodeApi` over the official ``kubernetes`` client (kubeconfig auth and TLS).

    Responses are read as plain JSON (``_preload_content=False``): the gate works on the API's
    objects as the API sends them, and turning a thousand Nodes into model objects it never
    uses would cost most of its time."""

    def __init__(self, kubeconfig: Path | None, timeout: tuple[float, float] = (5.0, 60.0)):
        from kubernetes import client, config  # noqa: PLC0415 (slow import; gate only)

        self._client = client
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]  # untyped upstream
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration)
        except (config.ConfigException, OSError, TypeError, ValueError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise GateError(f"cannot load the kubeconfig {where}: {exc}") from None
        # Fail fast and say so: an unreachable API is the operator's to fix, not to wait on.
        configuration.retries = 0
        self._api = client.CoreV1Api(client.ApiClient(configuration))
        self._timeout = timeout
        self.server: str = str(configuration.host)
        self.calls: Counter[str] = Counter()

    def _call(self, verb: str, method: Callable[..., Any], *args: Any,
              **kwargs: Any) -> dict[str, Any]:
        self.calls[verb] += 1
        try:
            response = method(*args, _preload_content=False, _request_timeout=self._timeout,
                              **kwargs)
            data: dict[str, Any] = json.loads(response.data)
            return data
        except self._client.exceptions.ApiException as exc:
            status = int(exc.status or 0)
            message = _status_message(exc.body) or str(exc.reason)
            if status == 409:
                raise Conflict(message) from None
            if status == 404:
                raise NotFound(message) from None
            if status in (401, 403):
                raise ApiUnavailable(f"the API server at {self.server} refused the gate "
                                     f"({status}): {message}") from None
            raise GateError(f"the API server at {self.server} answered {status}: "
                            f"{message}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            # MaxRetryError (retries are off) carries the refused or timed-out connection.
            raise ApiUnavailable(f"cannot reach the Kubernetes API at {self.server}: "
                                 f"{_short(exc)}") from None

    def list_nodes(self) -> list[dict[str, Any]]:
        items = self._call("list", self._api.list_node).get("items") or []
        return [dict(item) for item in items]

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("get", self._api.read_node, name)

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._call("patch", self._api.patch_node, name, dict(patch),
                          _content_type=MERGE_PATCH)


def _status_message(body: Any) -> str:
    try:
        doc = json.loads(body or "{}")
    except (TypeError, ValueError):
        return str(body or "")
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    marker = "Failed to establish a new connection: "
    return text.split(marker, 1)[1].rstrip(")\"'") if marker in text else text


# -- inputs -----------------------------------------------------------------------------------
def run_results(run_dir: Path) -> dict[str, NodeResults]:
    """Per node, what a run directory's results say (validate/report.py's files)."""
    if not (run_dir / "results.parquet").exists() and not (run_dir / "results.csv").exists():
        raise GateError(f"{run_dir} holds no validation results (results.parquet or "
                        "results.csv); run `python -m validate run` first")
    df = load_results(run_dir)
    out: dict[str, NodeResults] = {}
    for node, rows in df.groupby("node", sort=True):
        statuses = [Status(s) for s in rows["status"].astype(str)]
        bad = rows[rows["status"].astype(str).isin([Status.FAIL.value, Status.ERROR.value])]
        codes = tuple(sorted({str(c) for c in bad["code"] if c and c != CODE_OK}))
        out[str(node)] = NodeResults(
            run_id=str(rows["run_id"].iloc[0]) if len(rows) else run_dir.name,
            status=worst(statuses), codes=codes,
            gpu_count=_value(rows, "gpu.count", "gpu_count"),
            gpu_memory_mib=_value(rows, "gpu.memory", "memory_total_mib"),
            gpu_model_status=_row_status(rows, "gpu.model"),
            gpu_model_detail=_detail(rows, "gpu.model"))
    return out


def _row(rows: pd.DataFrame, check: str, metric: str | None = None) -> pd.Series | None:
    sub = rows[rows["check"] == check]
    if metric is not None:
        sub = sub[sub["metric"] == metric]
    return None if sub.empty else sub.iloc[0]


def _value(rows: pd.DataFrame, check: str, metric: str) -> int | None:
    row = _row(rows, check, metric)
    if row is None or pd.isna(row["value"]) or str(row["status"]) == Status.ERROR.value:
        return None
    return int(row["value"])


def _row_status(rows: pd.DataFrame, check: str) -> Status | None:
    row = _row(rows, check)
    return None if row is None else Status(str(row["status"]))


def _detail(rows: pd.DataFrame, check: str) -> str:
    row = _row(rows, check)
    return "" if row is None else str(row["detail"])


def identity_of(node: Node) -> NodeIdentity:
    """The declared identity of an inventory node (its pool and its profile's hardware)."""
    profile = profile_for(node)
    hw = profile.hardware
    return NodeIdentity(name=node.desired.gate.node_name or node.name,
                        host=node.name, pool=node.pool, profile=profile.name,
                        gpu_pool=dict(node.gpu_pool),
                        gpu_count=hw.gpu_count, gpu_model=hw.gpu_model,
                        gpu_memory_mib=hw.gpu_memory_mib, nvswitch=hw.nvswitch,
                        nvlinks_per_gpu=hw.nvlinks_per_gpu)


def _one_setting(nodes: Sequence[Node], var: str, value: Callable[[Node], str | None]
                 ) -> str | None:
    values = {v for n in nodes if (v := value(n))}
    if len(values) > 1:
        raise GateError(f"the inventory sets {var} differently across nodes "
                        f"({', '.join(sorted(values))}); the gate needs one")
    return values.pop() if values else None


def inventory_settings(nodes: Sequence[Node], prefix: str | None = None,
                       kubeconfig: Path | None = None) -> tuple[str, Path | None]:
    """The label prefix (``prefix``, else the inventory's, checked) and the kubeconfig
    (``kubeconfig``, else the inventory's, else None: KUBECONFIG / ~/.kube/config) the gate
    works with. Raises GateError or ValueError naming the setting."""
    prefix = check_prefix(prefix or _one_setting(nodes, desired.LABEL_PREFIX,
                                                lambda n: n.desired.gate.label_prefix) or "")
    config_var = _one_setting(nodes, desired.KUBECONFIG, lambda n: n.desired.gate.kubeconfig)
    return prefix, kubeconfig or (Path(config_var).expanduser() if config_var else None)


# -- the reconcile ----------------------------------------------------------------------------
@dataclass
class NodeOutcome:
    node: str
    pool: str
    verdict: str  # passed | failed | not-registered | error
    codes: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    changes: list[dict[str, str | None]] = field(default_factory=list)
    patched: bool = False
    attempts: int = 0
    error: str = ""


@dataclass
class GateReport:
    run_id: str
    time: str
    dry_run: bool
    prefix: str
    api_server: str
    nodes: list[NodeOutcome]
    calls: dict[str, int]
    skipped: list[str]  # inventory nodes the run did not validate (left alone)

    @property
    def exit_code(self) -> ExitCode:
        if any(o.verdict == ERROR for o in self.nodes):
            return ExitCode.USAGE_OR_TOOL_ERROR
        if any(o.verdict != PASSED for o in self.nodes):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def summary(self) -> str:
        """One line; gate.yml reads ``gate: patched N`` from it."""
        changed = sum(1 for o in self.nodes if o.changes)
        right = sum(1 for o in self.nodes if not o.changes and o.verdict in (PASSED, FAILED))
        verdicts = Counter(o.verdict for o in self.nodes)
        calls = ", ".join(f"{n} {verb}" for verb, n in sorted(self.calls.items())) or "none"
        head = (f"gate: dry run, would patch {changed}" if self.dry_run else
                f"gate: patched {sum(1 for o in self.nodes if o.patched)}")
        tail = "; nothing to change" if changed == 0 else ""
        return (f"{head}, already right {right}; passed {verdicts[PASSED]}, failed "
                f"{verdicts[FAILED]}, not registered {verdicts[NOT_REGISTERED]}, errors "
                f"{verdicts[ERROR]}; API calls: {calls}{tail}")


def reconcile(api: NodeApi, identities: Sequence[NodeIdentity],
              results: Mapping[str, NodeResults], prefix: str, dry_run: bool = False,
              run_id: str = "", broken: Sequence[NodeOutcome] = ()) -> GateReport:
    """One list, then a patch for each Node that differs (none in a dry run). ``broken``:
    nodes whose identity could not be read (reported as errors, left alone)."""
    nodes = {str(n["metadata"]["name"]): n for n in api.list_nodes()}
    outcomes: list[NodeOutcome] = [o for o in broken if o.node in results]
    skipped = [o.node for o in broken if o.node not in results]
    for identity in identities:
        result = results.get(identity.inventory_name)
        if result is None:
            skipped.append(identity.name)
            continue
        outcome = NodeOutcome(identity.name, identity.pool, FAILED)
        outcomes.append(outcome)
        node = nodes.get(identity.name)
        if node is None:
            outcome.verdict = NOT_REGISTERED
            outcome.codes = sorted({*result.codes, CODE_NOT_REGISTERED})
            outcome.reasons = ["no Node of this name in the cluster (has it joined?)"]
            continue
        try:
            _gate_node(api, node, identity, result, prefix, dry_run, outcome)
        except IdentityError as exc:
            outcome.verdict, outcome.error = ERROR, str(exc)
        except NotFound:
            outcome.verdict = NOT_REGISTERED
            outcome.codes = sorted({*result.codes, CODE_NOT_REGISTERED})
            outcome.reasons = ["the Node was deleted while the gate ran"]
        except GateError as exc:
            outcome.verdict, outcome.error = ERROR, str(exc)
    return GateReport(run_id=run_id, time=datetime.now(UTC).isoformat(timespec="seconds"),
                      dry_run=dry_run, prefix=prefix, api_server=api.server, nodes=outcomes,
                      calls=dict(api.calls), skipped=skipped)


def decide(node: Mapping[str, Any], identity: NodeIdentity, results: NodeResults,
           prefix: str) -> tuple[Desired, NodePlan]:
    """The gate's decision for one Node (the API's object) from one run's results: the verdict
    and what the Node should carry, and the changes that would make it so. Pure: the gate acts
    on it, drift's labels layer (validate/drift/labels.py) reports it. Raises IdentityError."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    wanted = desired_state(identity, results, prefix, gfd_of(labels))
    return wanted, plan_node(node, wanted, prefix)


def _gate_node(api: NodeApi, node: dict[str, Any], identity: NodeIdentity,
               results: NodeResults, prefix: str, dry_run: bool, outcome: NodeOutcome) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        desired, plan = decide(node, identity, results, prefix)
        outcome.verdict, outcome.codes = desired.verdict, list(desired.codes)
        outcome.reasons = list(desired.reasons)
        outcome.changes = [asdict(c) for c in plan.changes]
        if plan.patch is None or dry_run:
            return
        outcome.attempts = attempt
        try:
            api.patch_node(identity.name, plan.patch)
            outcome.patched = True
            return
        except Conflict:
            if attempt == MAX_ATTEMPTS:
                raise GateError(f"{identity.name}: the Node kept changing under the gate "
                                f"({MAX_ATTEMPTS} conflicts); run the gate again") from None
            time.sleep(0.05 * attempt)
            node = api.get_node(identity.name)


# -- the command ------------------------------------------------------------------------------
def print_report(report: GateReport, out: TextIO) -> None:
    for o in report.nodes:
        why = f" ({', '.join(o.codes)})" if o.codes else ""
        done = ("would change" if report.dry_run else
                f"patched in {o.attempts} attempt(s)" if o.patched else "")
        state = (f"{o.verdict}{why}" + (f"; {done}" if o.changes and done else "")
                 + ("; already right" if not o.changes and o.verdict in (PASSED, FAILED)
                    else ""))
        out.write(f"{o.node}: {state}\n")
        for reason in o.reasons:
            out.write(f"  ! {reason}\n")
        if o.error:
            out.write(f"  error: {o.error}\n")
        for c in o.changes:
            out.write(f"  {c['kind']} {c['key']}: {c['old'] or '<none>'} -> "
                      f"{c['new'] or '<none>'}\n")
    if report.skipped:
        out.write(f"not in this run (left alone): {', '.join(report.skipped)}\n")
    out.write(report.summary() + "\n")


def write_report(report: GateReport, run_dir: Path) -> Path:
    target = run_dir / REPORT_FILE
    doc = {**asdict(report), "summary": report.summary(), "exit_code": int(report.exit_code)}
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, target)
    return target


def cmd_gate(inventory: Path, run_dir: Path, *, limit: str | None, dry_run: bool,
             kubeconfig: Path | None, prefix: str | None, stdout: TextIO, stderr: TextIO,
             api_factory: Callable[[Path | None], NodeApi] = KubeNodeApi) -> ExitCode:
    """The ``gate`` subcommand; every failure is a message and an exit code."""
    try:
        run = run_dir.resolve()
        results = run_results(run)
        nodes = load(inventory, limit)
        if not nodes:
            raise GateError(f"no GPU nodes in {inventory} match {limit!r}")
        prefix, config = inventory_settings(nodes, prefix, kubeconfig)
        identities, broken = [], []
        # load() has loaded every node's profile; one that broke since (the file changed) is
        # still that node's error and does not keep the others out.
        for node in nodes:
            try:
                identities.append(identity_of(node))
            except ProfileError as exc:
                broken.append(NodeOutcome(node.name, node.pool, ERROR, error=str(exc)))
        api = api_factory(config)
        run_id = next(iter(results.values())).run_id if results else run.name
        environment = _one_setting(nodes, desired.ENVIRONMENT,
                                   lambda n: n.desired.environment)
        stderr.write(f"gate: run {run_id} ({len(results)} nodes validated), API {api.server}"
                     + (f" [{environment}]" if environment else "")
                     + (" - dry run, nothing will change" if dry_run else "") + "\n")
        report = reconcile(api, identities, results, prefix, dry_run, run_id, broken)
    except (GateError, InventoryError, ProfileError, ValueError, OSError) as exc:
        stderr.write(f"gate: error: {exc}\n")
        stderr.write("gate: nothing was changed\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    print_report(report, stdout)
    if not dry_run:
        stdout.write(f"gate: report {write_report(report, run)}\n")
    return report.exit_code
