"""``python -m validate gate``: label and admit the inventory's nodes from a validation run.

    python -m validate gate -i <inventory> [--run <run-dir>] [--limit PATTERN] [--dry-run]
                            [--kubeconfig FILE] [--prefix DOMAIN] [--log FILE]
    python -m validate gate -i <inventory> --release NODE --reason TEXT [--dry-run] ...

For every inventory node, the gate reads what the run holds about it (validate/evidence.py),
decides what the node should carry (:func:`validate.labels.decide`, a pure function of that
evidence and the Node as the API server has it) and reconciles the Node with the official
``kubernetes`` client: one list of the Nodes, then one JSON merge patch per Node that needs a
change, guarded by the ``resourceVersion`` the list returned. On 409 Conflict (the kubelet or
someone else wrote in between) it reads that Node again and decides again, up to
``MAX_ATTEMPTS`` times. A Node already right gets no request at all.

Only a fresh (within the pool's ``gpuready_gate_max_run_age``, default 24h), complete (every
check), finite run that holds the node and passes admits it; anything else keeps it out or
leaves it as it is (``held``), each with its code (``gate.stale_run``,
``gate.incomplete_run``, ``gate.non_finite_value``, ``gate.node_not_in_run``,
``gate.superseded_run``). A node with a hardware fault (validate/actions.py) is quarantined:
it stays out through clean runs until ``--release NODE --reason TEXT``, which records who, when
and why on the Node (``<prefix>/released``) and in the gate's log.

Every change (label, taint, annotation: old -> new) is printed per node and written to
``<run-dir>/gate.json``; each gate run and each release is one JSON line in the gate's log
(``--log``, default ``gate.log`` in the reports root, the run directory's parent).
``--dry-run`` prints the same plan and changes and writes nothing. The kubeconfig is
``--kubeconfig``, else the inventory's ``gpuready_kubeconfig``, else ``KUBECONFIG`` /
``~/.kube/config``; the prefix is ``--prefix``, else ``gpuready_label_prefix``.

Exit codes (validate/model.py's table): 0 every gated node passed and carries what it should;
1 a node stays out (failed, quarantined, not registered) or was not admitted by this run
(``held``: stale, incomplete, not in the run, superseded); 2 usage or tool error: bad input
(a results file missing a column or with an unknown status, a run without rows
(``gate.empty_run``), a value that is not finite (``gate.non_finite_value``)), no run, or an
API that cannot be reached, refuses, or whose certificate does not verify (nothing was changed
on a node the gate could not judge; an unreachable API means nothing was changed at all).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import urllib3

from validate import desired, kube_response
from validate.inventory import InventoryError, Node, load, profile_for
from validate.labels import (
    CODE_NOT_REGISTERED,
    FAILED,
    HELD,
    PASSED,
    QUARANTINED,
    TOOL_ERRORS,
    Desired,
    GatePolicy,
    IdentityError,
    NodeEvidence,
    NodeIdentity,
    NodePlan,
    NotQuarantined,
    check_prefix,
    decide,
    not_in_run,
    plan_node,
    release_patch,
)
from validate.model import ExitCode
from validate.profiles import ProfileError
from validate.text import one_line

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]  # no pandas-stubs pinned

# The run's evidence (validate/evidence.py: pandas, pyarrow) is imported where a run is read,
# not with the gate: `upgrade mark`, `finish` and `gate --release` read no run.

MAX_ATTEMPTS = 5
MERGE_PATCH = "application/merge-patch+json"
REPORT_FILE = "gate.json"
LOG_FILE = "gate.log"
# Verdicts of a node in the gate's report, besides passed/failed/quarantined/held.
NOT_REGISTERED = "not-registered"
ERROR = "error"
# The longest release reason kept (an annotation holds it; a page of text belongs in a ticket).
MAX_REASON = 1000


class GateError(Exception):
    """The gate cannot do its work (exit 2); the message says why."""


class ApiUnavailable(GateError):
    """The API server cannot be reached, refuses the gate's credentials, or its certificate
    does not verify."""


class TooManyRequests(GateError):
    """429: the API server refused for now (an eviction a PodDisruptionBudget does not allow)."""


class Forbidden(GateError):
    """403: the API server refused the request (RBAC, or an admission policy); the message
    names the request and what to do."""


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
    uses would cost most of its time. Each is checked before use (validate/kube_response.py:
    JSON, its kind and apiVersion, the types of the fields read); one that is not what was
    asked for is a GateError naming the request and what came back."""

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

    def _call(self, verb: str, endpoint: str, method: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
        """One request (``endpoint``: ``GET /api/v1/nodes``, as messages name it); its body
        as JSON, decoded by kube_response (the caller checks its kind)."""
        self.calls[verb] += 1
        try:
            response = method(*args, _preload_content=False, _request_timeout=self._timeout,
                              **kwargs)
            data = response.data
        except self._client.exceptions.ApiException as exc:
            status = int(exc.status or 0)
            message = kube_response.status_message(exc.body) or one_line(str(exc.reason))
            if status == 409:
                raise Conflict(message) from None
            if status == 404:
                raise NotFound(f"{endpoint}: 404 Not Found: {message}") from None
            if status == 429:
                raise TooManyRequests(message) from None
            if status == 401:
                raise ApiUnavailable(kube_response.refusal(endpoint, self.server, status,
                                                           message)) from None
            if status == 403:
                raise Forbidden(kube_response.refusal(endpoint, self.server, status,
                                                      message)) from None
            raise GateError(f"{endpoint}: the API server at {self.server} answered {status}: "
                            f"{message}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            untrusted = _certificate_failure(exc)
            if untrusted is not None:
                raise ApiUnavailable(
                    f"the API server at {self.server} answered, but its certificate did not "
                    f"verify against the kubeconfig's certificate authority: {untrusted} (a "
                    "wrong certificate-authority-data in the kubeconfig, or a server that is "
                    "not the cluster's)") from None
            # MaxRetryError (retries are off) carries the refused or timed-out connection.
            raise ApiUnavailable(f"cannot reach the Kubernetes API at {self.server}: "
                                 f"{_short(exc)}") from None
        try:
            return kube_response.decode(endpoint, data)
        except kube_response.BadResponse as exc:
            raise GateError(str(exc)) from None

    def checked(self, check: Callable[..., Any], endpoint: str, doc: Any, *args: Any) -> Any:
        """``check(endpoint, doc, *args)`` (a kube_response check), its BadResponse a
        GateError."""
        try:
            return check(endpoint, doc, *args)
        except kube_response.BadResponse as exc:
            raise GateError(str(exc)) from None

    def list_nodes(self) -> list[dict[str, Any]]:
        endpoint = "GET /api/v1/nodes"
        doc = self._call("list", endpoint, self._api.list_node)
        return [dict(item) for item in self.checked(kube_response.items, endpoint, doc, "Node",
                                                    "v1")]

    def get_node(self, name: str) -> dict[str, Any]:
        endpoint = f"GET /api/v1/nodes/{name}"
        doc = self._call("get", endpoint, self._api.read_node, name)
        return dict(self.checked(kube_response.obj, endpoint, doc, "Node", "v1"))

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        endpoint = f"PATCH /api/v1/nodes/{name}"
        doc = self._call("patch", endpoint, self._api.patch_node, name, dict(patch),
                         _content_type=MERGE_PATCH)
        return dict(self.checked(kube_response.obj, endpoint, doc, "Node", "v1"))


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: urllib3's ``reason``, ``__cause__``, ``__context__``."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        yield one
        todo += [e for e in (getattr(one, "reason", None), one.__cause__, one.__context__,
                             *one.args) if isinstance(e, BaseException)]


def _certificate_failure(exc: BaseException) -> str | None:
    """What the TLS handshake said when the server's certificate did not verify, else None."""
    for one in _causes(exc):
        if isinstance(one, ssl.SSLCertVerificationError):
            return str(one.verify_message or one.reason or one)
    return None


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    marker = "Failed to establish a new connection: "
    return text.split(marker, 1)[1].rstrip(")\"'") if marker in text else text


# -- inputs -----------------------------------------------------------------------------------
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


def decision_for(node: Node, rows: pd.DataFrame | None, run_id: str,
                 node_object: Mapping[str, Any] | None, prefix: str,
                 now: datetime | None = None) -> Desired:
    """The gate's decision for an inventory node, from its rows of a run (None: not in it)
    and its Node as the API server has it: what the gate would set, and what drift compares
    the Node against. The pure :func:`validate.labels.decide` with this node's identity,
    evidence, freshness window and taint effect. Raises ProfileError, IdentityError."""
    from validate.evidence import node_evidence  # noqa: PLC0415  (lazy: pandas)

    evidence = node_evidence(rows, run_id=run_id, now=now or datetime.now(UTC),
                             max_age_s=node.desired.gate.max_run_age_s)
    return decide(identity_of(node), evidence, node_object,
                  GatePolicy(prefix, node.desired.gate.taint_effect))


def evidence_for(nodes: Sequence[Node], run_dir: Path,
                 now: datetime | None = None) -> tuple[str, dict[str, NodeEvidence]]:
    """The run's id and each inventory node's evidence from it (nodes it lacks included),
    judged against the node's own freshness window. Raises GateError for a run that cannot
    be read or holds no rows."""
    from validate.evidence import EmptyRun, by_node, node_evidence, read_run  # noqa: PLC0415
    from validate.results import ResultsError  # noqa: PLC0415  (both lazy: pandas, pyarrow)

    try:
        run = read_run(run_dir)
    except (FileNotFoundError, ResultsError, EmptyRun) as exc:
        raise GateError(str(exc)) from None
    when = now or datetime.now(UTC)
    rows = by_node(run.rows)
    return run.run_id, {
        n.name: node_evidence(rows.get(n.name), run_id=run.run_id, now=when,
                              max_age_s=n.desired.gate.max_run_age_s)
        for n in nodes}


def _one_setting(nodes: Sequence[Node], var: str, value: Callable[[Node], str | None]
                 ) -> str | None:
    values = {v for n in nodes if (v := value(n))}
    if len(values) > 1:
        raise GateError(f"the inventory sets {var} differently across nodes "
                        f"({', '.join(sorted(values))}); the gate needs one")
    return values.pop() if values else None


# -- the reconcile ----------------------------------------------------------------------------
@dataclass
class NodeOutcome:
    node: str
    pool: str
    verdict: str  # passed | failed | quarantined | held | not-registered | error
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

    @property
    def exit_code(self) -> ExitCode:
        if any(o.verdict == ERROR or TOOL_ERRORS & set(o.codes) for o in self.nodes):
            return ExitCode.USAGE_OR_TOOL_ERROR
        if any(o.verdict != PASSED for o in self.nodes):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def summary(self) -> str:
        """One line; gate.yml reads ``gate: patched N`` from it."""
        changed = sum(1 for o in self.nodes if o.changes)
        judged = (PASSED, FAILED, QUARANTINED)
        right = sum(1 for o in self.nodes if not o.changes and o.verdict in judged)
        verdicts = Counter(o.verdict for o in self.nodes)
        calls = ", ".join(f"{n} {verb}" for verb, n in sorted(self.calls.items())) or "none"
        head = (f"gate: dry run, would patch {changed}" if self.dry_run else
                f"gate: patched {sum(1 for o in self.nodes if o.patched)}")
        tail = "; nothing to change" if changed == 0 else ""
        return (f"{head}, already right {right}; passed {verdicts[PASSED]}, failed "
                f"{verdicts[FAILED]}, quarantined {verdicts[QUARANTINED]}, held "
                f"{verdicts[HELD]}, not registered {verdicts[NOT_REGISTERED]}, errors "
                f"{verdicts[ERROR]}; API calls: {calls}{tail}")


def reconcile(api: NodeApi, identities: Sequence[NodeIdentity],
              evidence: Mapping[str, NodeEvidence], prefix: str, dry_run: bool = False,
              run_id: str = "", broken: Sequence[NodeOutcome] = (),
              effects: Mapping[str, str] | None = None) -> GateReport:
    """One list, then a patch for each Node that differs (none in a dry run). ``evidence``
    by inventory name (a node without any is not in the run); ``effects``: the failed taint's
    effect by Node name (default NoSchedule); ``broken``: nodes whose identity could not be
    read (reported as errors, left alone)."""
    nodes = {str(n["metadata"]["name"]): n for n in api.list_nodes()}
    outcomes: list[NodeOutcome] = list(broken)
    for identity in identities:
        found = evidence.get(identity.inventory_name)
        if found is None:
            found = not_in_run(run_id)
        policy = GatePolicy(prefix, (effects or {}).get(identity.name, "NoSchedule"))
        outcome = NodeOutcome(identity.name, identity.pool, FAILED)
        outcomes.append(outcome)
        node = nodes.get(identity.name)
        try:
            if node is None:
                _not_registered(identity, found, policy, outcome)
                continue
            _gate_node(api, node, identity, found, policy, dry_run, outcome)
        except IdentityError as exc:
            outcome.verdict, outcome.error = ERROR, str(exc)
        except NotFound:
            outcome.verdict = NOT_REGISTERED
            outcome.codes = sorted({*(found.results.codes if found.results else ()),
                                    CODE_NOT_REGISTERED})
            outcome.reasons = ["the Node was deleted while the gate ran"]
        except GateError as exc:
            outcome.verdict, outcome.error = ERROR, str(exc)
    return GateReport(run_id=run_id, time=datetime.now(UTC).isoformat(timespec="seconds"),
                      dry_run=dry_run, prefix=prefix, api_server=api.server, nodes=outcomes,
                      calls=dict(api.calls))


def _not_registered(identity: NodeIdentity, evidence: NodeEvidence, policy: GatePolicy,
                    outcome: NodeOutcome) -> None:
    """A node without a Node: held when the run cannot judge it, else not registered."""
    wanted = decide(identity, evidence, None, policy)
    if wanted.hold:
        outcome.verdict, outcome.codes = HELD, list(wanted.codes)
        outcome.reasons = [*wanted.reasons, "no Node of this name in the cluster"]
        return
    outcome.verdict = NOT_REGISTERED
    outcome.codes = sorted({*wanted.codes, CODE_NOT_REGISTERED})
    outcome.reasons = ["no Node of this name in the cluster (has it joined?)"]


def _gate_node(api: NodeApi, node: dict[str, Any], identity: NodeIdentity,
               evidence: NodeEvidence, policy: GatePolicy, dry_run: bool,
               outcome: NodeOutcome) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        wanted: Desired = decide(identity, evidence, node, policy)
        plan: NodePlan = plan_node(node, wanted, policy.prefix)
        outcome.verdict, outcome.codes = wanted.verdict, list(wanted.codes)
        outcome.reasons = list(wanted.reasons)
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


# -- the gate's log ---------------------------------------------------------------------------
def operator() -> str:
    """Who runs the gate: the login user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


class GateLog:
    """The gate's log: one JSON object per line, appended and fsynced, never rewritten."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def check(self) -> None:
        """Raise GateError now if the log cannot be appended to (before anything changes)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise GateError(f"cannot write the gate's log {self.path}: {exc}") from None

    def append(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def log_path(run_dir: Path, given: Path | None) -> Path:
    """``--log``, else ``gate.log`` in the reports root (the run directory's parent)."""
    return given if given is not None else run_dir.resolve().parent / LOG_FILE


# -- the command ------------------------------------------------------------------------------
def print_report(report: GateReport, out: TextIO) -> None:
    for o in report.nodes:
        why = f" ({', '.join(o.codes)})" if o.codes else ""
        done = ("would change" if report.dry_run else
                f"patched in {o.attempts} attempt(s)" if o.patched else "")
        state = (f"{o.verdict}{why}" + (f"; {done}" if o.changes and done else "")
                 + ("; already right" if not o.changes and o.verdict in
                    (PASSED, FAILED, QUARANTINED) else "")
                 + ("; left as it is" if o.verdict == HELD else ""))
        out.write(f"{o.node}: {state}\n")
        # What a peer may have written (a Node's labels and annotations, an API message, a
        # tool's output in a reason) stays on its line (validate/text.py).
        for reason in o.reasons:
            out.write(f"  ! {one_line(reason)}\n")
        if o.error:
            out.write(f"  error: {one_line(o.error)}\n")
        for c in o.changes:
            out.write(f"  {c['kind']} {one_line(str(c['key']))}: "
                      f"{one_line(c['old'] or '<none>')} -> {one_line(c['new'] or '<none>')}\n")
    out.write(report.summary() + "\n")


def write_report(report: GateReport, run_dir: Path) -> Path:
    target = run_dir / REPORT_FILE
    doc = {**asdict(report), "summary": report.summary(), "exit_code": int(report.exit_code)}
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, target)
    return target


def _gate_record(report: GateReport, by: str) -> dict[str, Any]:
    """The gate run as one log line: its verdicts and what it changed."""
    return {"event": "gate", "time": report.time, "by": by, "run": report.run_id,
            "api_server": report.api_server, "exit_code": int(report.exit_code),
            "verdicts": dict(Counter(o.verdict for o in report.nodes)),
            "nodes": [{"node": o.node, "verdict": o.verdict, "codes": o.codes,
                       "changes": len(o.changes), "patched": o.patched}
                      for o in report.nodes if o.changes or o.verdict != PASSED]}


@dataclass(frozen=True)
class GateSetup:
    """The nodes the gate works on, the label prefix and the kubeconfig (None: KUBECONFIG /
    ~/.kube/config), as the gate resolves them."""

    nodes: tuple[Node, ...]
    prefix: str
    kubeconfig: Path | None


def setup_for(nodes: Sequence[Node], *, kubeconfig: Path | None = None,
              prefix: str | None = None) -> GateSetup:
    """The gate's settings for ``nodes``: ``prefix``, else the inventory's
    ``gpuready_label_prefix`` (checked); ``kubeconfig``, else its ``gpuready_kubeconfig``.
    The gate and drift's labels layer (validate/drift/labels.py) both read them here. Raises
    GateError (nodes that disagree on a setting) or ValueError (a prefix that cannot be)."""
    # node_join_node_name was checked as the inventory was read; a host without it is its
    # Node's name, which goes into the API's paths.
    unnamed = [n.name for n in nodes if not n.desired.gate.node_name
               and not desired.is_node_name(n.name)]
    if unnamed:
        raise GateError(f"{desired.NODE_NAME} is not set on host(s) {', '.join(unnamed[:5])}"
                        + (f" and {len(unnamed) - 5} more" if len(unnamed) > 5 else "")
                        + ", and the host's inventory name (the Node's name then) is not "
                        f"{desired.NODE_NAME_RULE}: set it to the name the kubelet registers")
    chosen = check_prefix(prefix or _one_setting(nodes, desired.LABEL_PREFIX,
                                                 lambda n: n.desired.gate.label_prefix) or "")
    config_var = _one_setting(nodes, desired.KUBECONFIG, lambda n: n.desired.gate.kubeconfig)
    config = kubeconfig or (Path(config_var).expanduser() if config_var else None)
    return GateSetup(tuple(nodes), chosen, config)


def _setup(inventory: Path, limit: str | None, kubeconfig: Path | None,
           prefix: str | None) -> GateSetup:
    nodes = load(inventory, limit)
    if not nodes:
        raise GateError(f"no GPU nodes in {inventory} match {limit!r}")
    return setup_for(nodes, kubeconfig=kubeconfig, prefix=prefix)


def cmd_gate(inventory: Path, run_dir: Path, *, limit: str | None, dry_run: bool,
             kubeconfig: Path | None, prefix: str | None, stdout: TextIO, stderr: TextIO,
             api_factory: Callable[[Path | None], NodeApi] = KubeNodeApi,
             log: Path | None = None, now: datetime | None = None) -> ExitCode:
    """The ``gate`` subcommand; every failure is a message and an exit code."""
    try:
        run = run_dir.resolve()
        setup = _setup(inventory, limit, kubeconfig, prefix)
        run_id, evidence = evidence_for(setup.nodes, run, now)
        identities, broken = [], []
        # load() has loaded every node's profile; one that broke since (the file changed) is
        # still that node's error and does not keep the others out.
        for node in setup.nodes:
            try:
                identities.append(identity_of(node))
            except ProfileError as exc:
                broken.append(NodeOutcome(node.name, node.pool, ERROR, error=str(exc)))
        gate_log = GateLog(log_path(run, log))
        if not dry_run:
            gate_log.check()
        api = api_factory(setup.kubeconfig)
        in_run = sum(1 for e in evidence.values() if e.results is not None)
        environment = _one_setting(setup.nodes, desired.ENVIRONMENT,
                                   lambda n: n.desired.environment)
        stderr.write(f"gate: run {run_id} ({in_run} of {len(setup.nodes)} nodes in it), API "
                     f"{api.server}" + (f" [{environment}]" if environment else "")
                     + (" - dry run, nothing will change" if dry_run else "") + "\n")
        effects = {(n.desired.gate.node_name or n.name): n.desired.gate.taint_effect
                   for n in setup.nodes}
        report = reconcile(api, identities, evidence, setup.prefix, dry_run, run_id, broken,
                           effects)
    except (GateError, InventoryError, ProfileError, ValueError, OSError) as exc:
        stderr.write(f"gate: error: {exc}\n")
        stderr.write("gate: nothing was changed\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    print_report(report, stdout)
    if not dry_run:
        stdout.write(f"gate: report {write_report(report, run)}\n")
        try:
            gate_log.append(_gate_record(report, operator()))
        except OSError as exc:
            stderr.write(f"gate: warning: cannot append to the gate's log {gate_log.path}: "
                         f"{exc}\n")
    return report.exit_code


def cmd_release(inventory: Path, node_name: str, reason: str, *, run_dir: Path,
                dry_run: bool, kubeconfig: Path | None, prefix: str | None, stdout: TextIO,
                stderr: TextIO, api_factory: Callable[[Path | None], NodeApi] = KubeNodeApi,
                log: Path | None = None, by: str | None = None) -> ExitCode:
    """``gate --release NODE --reason TEXT``: lift a node's quarantine, recorded on the Node
    (``<prefix>/released``: who, when, why) and in the gate's log. The node stays tainted:
    the next fresh, complete passing run admits it."""
    try:
        # Control characters are kept as visible escapes: the reason is shown on terminals
        # (this one, kubectl's, a log reader's) as typed, and acts on none of them.
        why = one_line(" ".join(reason.split()))
        if not why:
            raise GateError("--reason is empty: say why the node may go back (what was "
                            "repaired or replaced, the ticket)")
        if len(why) > MAX_REASON:
            raise GateError(f"--reason is {len(why)} characters; keep it to {MAX_REASON} (a "
                            "ticket reference and a line)")
        setup = _setup(inventory, None, kubeconfig, prefix)
        names = {(n.desired.gate.node_name or n.name): n for n in setup.nodes}
        names.update({n.name: n for n in setup.nodes})
        if node_name not in names:
            raise GateError(f"{node_name} is not a GPU node of {inventory}")
        node_of = names[node_name]
        name = node_of.desired.gate.node_name or node_of.name
        gate_log = GateLog(log_path(run_dir, log))
        if not dry_run:
            gate_log.check()
        api = api_factory(setup.kubeconfig)
        who = by or operator()
        record: dict[str, Any] = {}
        changes: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                node = api.get_node(name)
            except NotFound:
                raise GateError(f"no Node named {name} in the cluster at {api.server}") from None
            at = datetime.now(UTC).isoformat(timespec="seconds")
            patch, record = release_patch(node, setup.prefix, by=who, at=at, reason=why)
            changes = _patch_lines(node, patch)
            if dry_run:
                break
            try:
                api.patch_node(name, patch)
                break
            except Conflict:
                if attempt == MAX_ATTEMPTS:
                    raise GateError(f"{name}: the Node kept changing ({MAX_ATTEMPTS} "
                                    "conflicts); release it again") from None
                time.sleep(0.05 * attempt)
    except NotQuarantined as exc:
        stderr.write(f"gate: error: {exc}\ngate: nothing was changed\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    except (GateError, InventoryError, ProfileError, ValueError, OSError) as exc:
        stderr.write(f"gate: error: {exc}\ngate: nothing was changed\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    codes = one_line(", ".join(record["codes"]))
    verb = "would release" if dry_run else "released"
    stdout.write(f"{name}: {verb} from quarantine ({codes}; run "
                 f"{one_line(record['run']) or '?'}) by {one_line(who)}: {why}\n")
    for line in changes:
        stdout.write(f"  {line}\n")
    if dry_run:
        stdout.write("gate: dry run, nothing was changed\n")
        return ExitCode.OK
    try:
        gate_log.append({"event": "release", "node": name, "api_server": api.server,
                         **record})
    except OSError as exc:
        stderr.write(f"gate: warning: released on the Node, but cannot append to the gate's "
                     f"log {gate_log.path}: {exc}\n")
        return ExitCode.USAGE_OR_TOOL_ERROR
    stdout.write(f"gate: recorded on the Node ({setup.prefix}/released) and in "
                 f"{gate_log.path}; {name} stays tainted until a fresh, complete passing run "
                 "is gated\n")
    return ExitCode.OK


def _patch_lines(node: Mapping[str, Any], patch: Mapping[str, Any]) -> list[str]:
    """A release patch's changes, as the gate prints its own."""
    meta = node.get("metadata") or {}
    lines = []
    for kind, field_name in (("label", "labels"), ("annotation", "annotations")):
        now = meta.get(field_name) or {}
        for key, new in sorted((patch["metadata"].get(field_name) or {}).items()):
            lines.append(f"{kind} {one_line(key)}: {one_line(now.get(key) or '<none>')} -> "
                         f"{one_line(new or '<none>')}")
    return lines
