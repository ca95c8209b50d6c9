"""``fabric.nccl_pair``: multi-node NCCL between pairs of nodes of one pool, suspect/confirm.

Single-node checks prove a node's GPUs and NVLink; a weak cable, a port carrying half its rate
or a misconfigured HCA shows only when two nodes talk. Every node of a pool whose fabric is
RDMA (``gpu_pool.fabric`` infiniband or roce) is paired with another node of the same pool and
the pair runs ``all_reduce_perf`` across both with Open MPI's ``mpirun`` (how one pair run
happens on the nodes, and what its output means: :mod:`validate.fabric_launch`).

Two passes, O(n) pair runs, each node in at most a few:

1. Disjoint pairs (sorted names, 1-2, 3-4, ...) run in parallel. A pair below the pool's
   ``nccl_pair.busbw_gbps`` fail band, or with wrong results, makes both nodes *suspects*; a
   pair that errors without saying whose fault it is (a hang, an SSH hop refused) makes both
   nodes *untested*; an error that is one node's own (unreachable, no ``mpirun``) is that
   node's verdict and leaves its partner untested. An odd node out is untested.
2. Each suspect or untested node is paired with a node that passed pass 1 (that node
   launches), in rounds that use each good node once. A node that fails again is confirmed
   bad; one that passes is cleared: its pass-1 partner was the cause.

Rows: one per node, check ``fabric.nccl_pair``, metric ``busbw_gbps``: the bus bandwidth of the
run that decided the node's verdict, judged against the pool's band; the detail names every
pair the node was in and what each measured. Nodes without an RDMA fabric, or alone in their
pool, get a ``skip`` row. Every pair run is also a row of ``fabric_pairs.csv`` in the run's
report directory.

Codes: ``fabric.nccl_pair.low_busbw``, ``fabric.nccl_pair.wrong_results`` (fail);
``fabric.nccl_pair.unresolved`` (no node of the pool passed, so a suspect could not be told
from its partner), ``fabric.nccl_pair.interrupted``, the transport's and tools' own codes and
those of :mod:`validate.fabric_launch` (error).

Inventory variables (pool or host; all optional): ``gpuready_fabric_nccl_ib_hca``
(NCCL_IB_HCA), ``gpuready_fabric_nccl_ib_gid_index`` (NCCL_IB_GID_INDEX, RoCE),
``gpuready_fabric_nccl_socket_ifname`` (NCCL_SOCKET_IFNAME), ``gpuready_fabric_nccl_env``
(more NCCL_*/UCX_* variables) and ``gpuready_fabric_mpi_mca`` (Open MPI MCA parameters, such as
``btl_tcp_if_include``). Profile: ``thresholds.nccl_pair`` {``busbw_gbps`` band, ``size_bytes``,
``iters``, ``warmup_iters``, ``timeout_s``}.
"""

from __future__ import annotations

import csv
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from validate import desired
from validate.checks.fabric import PAIR_CHECK_ID, PAIR_TITLE
from validate.fabric_launch import (
    CLEANUP_WAIT_S,
    KILL_AFTER_S,
    LAUNCHER_CLEANUP,
    LAUNCHER_SETUP,
    PEER_INSTALL,
    PEER_REMOVE,
    TRANSPORT_MARGIN_S,
    KeyLedger,
    LaunchError,
    PairSettings,
    RunVerdict,
    judge_output,
    key_tag,
    known_hosts_lines,
    launch_argv,
    mpirun_argv,
    parse_launcher_setup,
    remote_argv,
)
from validate.inventory import InventoryError, Node, profile_for
from validate.model import CODE_EXIT, CODE_HOSTKEY, CODE_INTERNAL, CheckResult, Status
from validate.profiles import Profile, ProfileError
from validate.transport import CommandResult, Transport, TransportError

LOG = logging.getLogger(__name__)

CHECK_ID = PAIR_CHECK_ID
TITLE = PAIR_TITLE
METRIC = "busbw_gbps"
RDMA_FABRICS = ("infiniband", "roce")
CODE_UNRESOLVED = "fabric.nccl_pair.unresolved"
CODE_INTERRUPTED = "fabric.nccl_pair.interrupted"
CODE_PROFILE = "profile.invalid"

VAR_IB_HCA = desired.IB_HCA
VAR_IB_GID_INDEX = desired.IB_GID_INDEX
VAR_SOCKET_IFNAME = desired.SOCKET_IFNAME
VAR_NCCL_ENV = desired.NCCL_ENV
VAR_MPI_MCA = desired.MPI_MCA
# Set by the launch itself (the run key and its SSH options); the inventory may not.
_RESERVED_MCA = ("plm_rsh_agent", "plm_rsh_args")
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_MCA_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")

# Seconds for each short remote step (key setup, install, removal).
STEP_TIMEOUT_S = 30.0
# How long the final sweep waits for key installs in flight before removing what is out.
SWEEP_WAIT_S = 45.0
# Run keys outlive their pair's timeout by this much at most (expiry-time on the peer, which
# has minute resolution).
KEY_GRACE_S = 180


# -- settings -------------------------------------------------------------------------------


def nccl_env(node: Node) -> tuple[tuple[str, str], ...]:
    """The NCCL environment the pair runs with, from the node's declared fabric settings
    (their types were checked when the inventory was read)."""
    fabric = node.desired.fabric
    env: dict[str, str] = {}
    if fabric.ib_hca is not None:
        env["NCCL_IB_HCA"] = fabric.ib_hca
    if fabric.ib_gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(fabric.ib_gid_index)
    if fabric.socket_ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = fabric.socket_ifname
    typed = {"NCCL_IB_HCA": f"set it with {VAR_IB_HCA}",
             "NCCL_IB_GID_INDEX": f"set it with {VAR_IB_GID_INDEX}",
             "NCCL_SOCKET_IFNAME": f"set it with {VAR_SOCKET_IFNAME}"}
    env.update(_named_values(node, VAR_NCCL_ENV, fabric.nccl_env, _ENV_NAME,
                             "an environment variable name (A-Z, 0-9, _)", typed))
    return tuple(sorted(env.items()))


def mpi_mca(node: Node) -> tuple[tuple[str, str], ...]:
    """Open MPI MCA parameters for the pair's mpirun, from the node's declared settings."""
    reserved = dict.fromkeys(_RESERVED_MCA, "set by the pair launch itself (the run key's SSH "
                             "options)")
    found = _named_values(node, VAR_MPI_MCA, node.desired.fabric.mpi_mca, _MCA_NAME,
                          "an MCA parameter name (a-z, 0-9, _)", reserved)
    return tuple(sorted(found.items()))


def _named_values(node: Node, var: str, values: Mapping[str, str], name: re.Pattern[str],
                  what: str, reserved: Mapping[str, str]) -> dict[str, str]:
    """``values`` (name -> one-line string) with every name checked against ``name`` and the
    names the suite sets itself."""
    for key in values:
        if not name.match(key):
            raise InventoryError(f"host {node.name}: {var}: {key!r} is not {what}")
        if key in reserved:
            raise InventoryError(f"host {node.name}: {var}.{key}: {reserved[key]}")
    return dict(values)


def pair_settings(node: Node, profile: Profile) -> PairSettings | str:
    """How the node's pool runs its pair test, or why the check does not apply (a str).

    Raises InventoryError for bad inventory variables, ProfileError for bad thresholds."""
    fabric = node.gpu_pool.get("fabric", "")
    if fabric not in RDMA_FABRICS:
        return f"pool {node.pool} has no RDMA fabric (gpu_pool.fabric {fabric or 'unset'})"
    if profile.hardware.nic_count == 0:
        return f"profile {profile.name} expects no RDMA NICs"
    pair = profile.thresholds.get("nccl_pair")
    if not isinstance(pair, Mapping) or "busbw_gbps" not in pair:
        # (an inventory may tune nccl_pair for every pool, also those without the test)
        return f"profile {profile.name} sets no nccl_pair thresholds"
    env, mca = nccl_env(node), mpi_mca(node)
    settings = PairSettings(
        gpus=profile.hardware.gpu_count,
        size_bytes=profile.value("nccl_pair.size_bytes", int),
        iters=profile.value("nccl_pair.iters", int, 20),
        warmup_iters=profile.value("nccl_pair.warmup_iters", int, 5),
        timeout_s=profile.value("nccl_pair.timeout_s", float, 600.0),
        band=profile.band("nccl_pair.busbw_gbps"),
        nccl_env=env,
        mca=mca,
    )
    for key, value in (("size_bytes", settings.size_bytes), ("iters", settings.iters),
                       ("timeout_s", settings.timeout_s)):
        if value <= 0:
            raise ProfileError(profile.source, f"thresholds.nccl_pair.{key}",
                               f"must be positive, got {value}")
    return settings


# -- the plan: pairs, triage, verdicts (pure) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class PairRun:
    """One pair run: who, which pass, and what it said (see RunVerdict)."""

    pass_no: int
    pool: str
    launcher: str
    peer: str
    status: Status
    code: str
    busbw_gbps: float | None
    detail: str
    blame: str | None
    duration_s: float
    time: str
    warn: float | None = None
    fail: float | None = None

    @property
    def passed(self) -> bool:
        return self.status in (Status.PASS, Status.WARN)

    def other(self, node: str) -> str:
        return self.peer if node == self.launcher else self.launcher


def first_pass(names: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Disjoint pairs of ``names`` in order (the first of each pair launches); the odd one
    out, if any."""
    pairs = [(names[i], names[i + 1]) for i in range(0, len(names) - 1, 2)]
    return pairs, list(names[len(pairs) * 2:])


@dataclass(frozen=True, slots=True)
class Triage:
    """After pass 1: nodes that passed, nodes to pair with one of them, nodes whose error is
    their own (not retested)."""

    good: tuple[str, ...]
    retest: tuple[str, ...]
    own_errors: tuple[str, ...]


def triage(names: Sequence[str], first: Sequence[PairRun], leftover: Sequence[str]) -> Triage:
    good: set[str] = set()
    retest: set[str] = set(leftover)
    own: set[str] = set()
    for run in first:
        members = {run.launcher, run.peer}
        if run.passed:
            good |= members
        elif run.blame in members:
            own.add(run.blame)
            retest |= members - {run.blame}
        else:
            retest |= members
    order = {n: i for i, n in enumerate(names)}
    return Triage(
        tuple(sorted(good, key=order.__getitem__)),
        tuple(sorted(retest - own, key=order.__getitem__)),
        tuple(sorted(own, key=order.__getitem__)),
    )


def second_pass(retest: Sequence[str], good: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of (good launcher, node to retest) pairs; each good node once per round."""
    if not good:
        return []
    return [
        [(good[i], node) for i, node in enumerate(retest[start:start + len(good)])]
        for start in range(0, len(retest), len(good))
    ]


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """A node's result: status, code, the deciding bus bandwidth, and its story."""

    node: str
    status: Status
    code: str
    busbw_gbps: float | None
    detail: str
    runs: tuple[PairRun, ...]
    warn: float | None = None
    fail: float | None = None


def _story(node: str, runs: Sequence[PairRun]) -> str:
    return "; ".join(
        f"pass {r.pass_no} pair {r.launcher}-{r.peer}: {r.status.value}, {r.detail}" for r in runs
    )


def verdicts(
    names: Sequence[str], first: Sequence[PairRun], second: Sequence[PairRun],
    leftover: Sequence[str],
) -> dict[str, NodeVerdict]:
    """Each node's verdict from its pass-1 and pass-2 runs (module docstring)."""
    out: dict[str, NodeVerdict] = {}
    for node in names:
        r1 = next((r for r in first if node in (r.launcher, r.peer)), None)
        r2 = next((r for r in second if r.peer == node), None)
        status, code, deciding, note = _decide(node, r1, r2, node in leftover)
        runs = tuple(r for r in (r1, r2) if r is not None)
        detail = "; ".join(filter(None, (_story(node, runs), note)))
        out[node] = NodeVerdict(
            node, status, code, deciding.busbw_gbps if deciding else None, detail, runs,
            deciding.warn if deciding else None, deciding.fail if deciding else None)
    return out


def _decide(
    node: str, r1: PairRun | None, r2: PairRun | None, leftover: bool
) -> tuple[Status, str, PairRun | None, str]:
    """(status, code, the run that decided, a note) for one node."""
    if r1 is not None and r1.passed:
        return r1.status, r1.code, r1, ""
    if r1 is not None and r1.blame == node:
        return Status.ERROR, r1.code, r1, "the error is this node's own"
    if r2 is not None:
        if r2.passed:
            cause = (f" (the pass-1 result was {r1.other(node)}'s)"
                     if r1 is not None and r1.status is Status.FAIL else "")
            return r2.status, r2.code, r2, f"cleared with {r2.launcher}, a node that passed{cause}"
        if r2.status is Status.FAIL:
            again = " too" if r1 is not None and r1.status is Status.FAIL else ""
            return (Status.FAIL, r2.code, r2,
                    f"confirmed: it fails with {r2.launcher}{again}, a node that passed")
        if r2.blame == r2.launcher:
            return (Status.ERROR, CODE_UNRESOLVED, r2,
                    f"its known-good partner {r2.launcher} failed by itself")
        return Status.ERROR, r2.code, r2, f"the error recurs with {r2.launcher}, a node that passed"
    alone = "no node of the pool passed to pair it with"
    if r1 is None:
        return (Status.ERROR, CODE_UNRESOLVED, None,
                f"odd one out in pass 1 and {alone}" if leftover else "not tested")
    if r1.status is Status.FAIL:
        return (Status.FAIL, r1.code, r1,
                f"unconfirmed: {alone}, so it cannot be told from its partner")
    if r1.blame is not None:
        return (Status.ERROR, CODE_UNRESOLVED, r1,
                f"its partner {r1.blame} failed by itself and {alone}")
    return Status.ERROR, r1.code, r1, alone


# -- running pairs --------------------------------------------------------------------------


class _Cancelled(Exception):
    """The run was interrupted before this step."""


class _KeyInstallLatch:
    """Key installs enter; the sweep closes the latch and waits for those in flight, so that
    nothing is installed after the sweep looked. (Not the admission gate, validate.gate.)"""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inflight = 0
        self.closed = False

    @contextmanager
    def enter(self) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise _Cancelled
            self._inflight += 1
        try:
            yield
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self._inflight == 0, timeout)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _cleanup(t: Transport, name: str, argv: list[str], what: str) -> str | None:
    """Run a cleanup step; None when it worked, else what went wrong."""
    try:
        result = t.run(argv, STEP_TIMEOUT_S)
    except TransportError as exc:
        return f"{name}: {exc.reason}"
    if not result.ok:
        return f"{name}: {what} exited {result.rc}: {result.stderr.strip()[-200:]}"
    return None


def _run_dir_name(run_id: str, pass_no: int, launcher: str, peer: str) -> str:
    # A name fixed before the directory exists, so that the ledger knows it even when the
    # setup step dies half-way; mkdir (no -p) refuses a name someone else made first.
    parts = (f"p{pass_no}", launcher, peer)
    return _run_dir_prefix(run_id) + ".".join(_SAFE.sub("_", p) for p in parts)


def _run_dir_prefix(run_id: str) -> str:
    """What every run directory of ``run_id`` starts with (the closing dot keeps run "a" from
    matching run "a1")."""
    return f"/tmp/gpuready-fabric.{_SAFE.sub('_', run_id)}."


@dataclass
class PairExecutor:
    """Runs pair runs over one transport per node; remembers what it left on nodes."""

    nodes: Mapping[str, Node]
    run_id: str
    transport_for: Callable[[Node], Transport]
    accept_unknown_host_keys: bool = False
    ledger: KeyLedger = field(default_factory=KeyLedger)
    key_installs: _KeyInstallLatch = field(default_factory=_KeyInstallLatch)
    _transports: dict[str, Transport] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self, name: str) -> Transport:
        with self._lock:
            if name not in self._transports:
                self._transports[name] = self.transport_for(self.nodes[name])
            return self._transports[name]

    def run_pair(self, launcher: str, peer: str, settings: PairSettings, pass_no: int) -> PairRun:
        """One pair run; never raises (every failure is a run with its code)."""
        start = time.monotonic()
        try:
            verdict = self._run(self.nodes[launcher], self.nodes[peer], settings, pass_no)
        except LaunchError as exc:
            verdict = RunVerdict(Status.ERROR, exc.code, None, exc.detail, exc.blame)
        except _Cancelled:
            verdict = RunVerdict(Status.ERROR, CODE_INTERRUPTED, None,
                                 "the run was interrupted before this pair ran")
        except Exception as exc:  # a bug here must not hide the other pairs
            LOG.exception("pair %s-%s crashed", launcher, peer)
            verdict = RunVerdict(Status.ERROR, CODE_INTERNAL, None, f"{type(exc).__name__}: {exc}")
        return PairRun(pass_no, self.nodes[launcher].pool, launcher, peer, verdict.status,
                       verdict.code, verdict.busbw_gbps, verdict.detail, verdict.blame,
                       round(time.monotonic() - start, 3), _now(), settings.band.warn,
                       settings.band.fail)

    def _run(self, launcher: Node, peer: Node, settings: PairSettings, pass_no: int
             ) -> RunVerdict:
        host_keys = known_hosts_lines(peer)
        strict = bool(host_keys)
        if not host_keys and not (self.accept_unknown_host_keys or peer.accept_unknown_host_keys):
            raise LaunchError(CODE_HOSTKEY, f"no host key for {peer.name} "
                              f"({peer.address}:{peer.port}) in {peer.known_hosts}: the hop "
                              f"from {launcher.name} could not be verified", peer.name)
        tag = key_tag(self.run_id, launcher.name)
        run_dir = _run_dir_name(self.run_id, pass_no, launcher.name, peer.name)
        ta, tb = self.transport(launcher.name), self.transport(peer.name)
        try:
            with self.key_installs.enter():
                # Into the ledger before the step: a step that dies half-way may have left it.
                # A transport error means the command never ran (the node was not reached).
                self.ledger.add_dir(launcher.name, run_dir)
                try:
                    setup = self._step(ta, launcher.name, remote_argv(
                        LAUNCHER_SETUP, tag, peer.address, "\n".join(host_keys), run_dir))
                except LaunchError:
                    self.ledger.drop_dir(launcher.name, run_dir)
                    raise
                info = parse_launcher_setup(setup, launcher.name)
                self.ledger.add_key(peer.name, tag)
                lifetime = int(settings.timeout_s + KILL_AFTER_S + TRANSPORT_MARGIN_S) + KEY_GRACE_S
                try:
                    installed = self._step(tb, peer.name, remote_argv(
                        PEER_INSTALL, info.public_key, str(lifetime), info.source_address))
                except LaunchError:
                    self.ledger.drop_key(peer.name, tag)
                    raise
                if not installed.ok:
                    raise LaunchError(CODE_EXIT, f"installing the run key on {peer.name} failed "
                                      f"(exit {installed.rc}): {installed.stderr.strip()[-200:]}",
                                      peer.name)
            argv = launch_argv(run_dir, mpirun_argv(settings, info.hostname, peer, run_dir, strict))
            try:
                result = ta.run(argv, settings.timeout_s + KILL_AFTER_S + TRANSPORT_MARGIN_S)
            except TransportError as exc:
                raise LaunchError(exc.code, f"{launcher.name} (launcher): {exc.reason}",
                                  launcher.name) from exc
            return judge_output(result, settings, launcher.name, peer.name)
        finally:
            # The launcher's mpirun first (it may still run after a transport timeout), then
            # whatever it left on the peer, and the key.
            self._remove_dir(ta, launcher.name, run_dir)
            self._remove(tb, peer.name, tag, run_dir)

    @staticmethod
    def _step(t: Transport, name: str, argv: list[str]) -> CommandResult:
        """A short remote step; a transport error (the command did not run) is the node's."""
        try:
            return t.run(argv, STEP_TIMEOUT_S)
        except TransportError as exc:
            raise LaunchError(exc.code, f"{name}: {exc.reason}", name) from exc

    def _remove(self, t: Transport, peer: str, tag: str, run_dirs: str) -> str | None:
        """Stop the peer's Open MPI daemons naming ``run_dirs`` (a run directory or the prefix
        of all of this run's) and remove the keys tagged ``tag`` (or starting with it) from the
        peer when the ledger has any; None when done, else why not."""
        if not self.ledger.has_key(peer, tag):
            return None
        problem = _cleanup(t, peer, remote_argv(PEER_REMOVE, tag, run_dirs, str(CLEANUP_WAIT_S)),
                           "removing run keys")
        if problem is None:
            self.ledger.drop_key(peer, tag)
        return problem

    def _remove_dir(self, t: Transport, launcher: str, run_dir: str) -> str | None:
        """Stop the pair's mpirun if it runs and remove its directory (and private key)."""
        if not self.ledger.has_dir(launcher, run_dir):
            return None
        problem = _cleanup(t, launcher, remote_argv(LAUNCHER_CLEANUP, run_dir, str(CLEANUP_WAIT_S)),
                           f"removing {run_dir}")
        if problem is None:
            self.ledger.drop_dir(launcher, run_dir)
        return problem

    def sweep(self) -> list[str]:
        """Close the key-install latch, then remove every key and run directory still out,
        over fresh connections (a worker may still hold its own). Returns what could not be
        removed."""
        if not self.key_installs.close(SWEEP_WAIT_S):
            LOG.warning("key installs still in flight after %.0f s; sweeping anyway",
                        SWEEP_WAIT_S)
        keys, dirs = self.ledger.outstanding()
        problems: list[str] = []
        fresh: dict[str, Transport] = {}
        try:
            for launcher, run_dirs in dirs.items():
                t = fresh.setdefault(launcher, self.transport_for(self.nodes[launcher]))
                problems += [p for d in run_dirs if (p := self._remove_dir(t, launcher, d))]
            for peer in keys:
                t = fresh.setdefault(peer, self.transport_for(self.nodes[peer]))
                problem = self._remove(t, peer, key_tag(self.run_id), _run_dir_prefix(self.run_id))
                if problem:
                    problems.append(problem)
        finally:
            for t in fresh.values():
                t.close()
        return problems

    def close(self) -> None:
        with self._lock:
            for t in self._transports.values():
                t.close()
            self._transports.clear()

    def run_wave(
        self, jobs: Sequence[tuple[str, str, PairSettings]], pass_no: int, concurrency: int,
        progress: Callable[[PairRun], None] | None = None,
    ) -> list[PairRun]:
        """Run ``jobs`` (launcher, peer, settings) at most ``concurrency`` at a time, on daemon
        threads: an interrupted run must not wait for a hung pair before it can clean up."""
        results: queue.Queue[tuple[int, PairRun]] = queue.Queue()
        slots = threading.Semaphore(max(1, concurrency))

        def work(index: int, launcher: str, peer: str, settings: PairSettings) -> None:
            with slots:
                results.put((index, self.run_pair(launcher, peer, settings, pass_no)))

        for index, (launcher, peer, settings) in enumerate(jobs):
            threading.Thread(target=work, args=(index, launcher, peer, settings), daemon=True,
                             name=f"fabric-{launcher}-{peer}").start()
        done: dict[int, PairRun] = {}
        while len(done) < len(jobs):
            try:
                index, run = results.get(timeout=0.5)
            except queue.Empty:
                continue
            done[index] = run
            if progress is not None:
                progress(run)
        return [done[i] for i in range(len(jobs))]


# -- the whole check ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FabricOutcome:
    """Rows (one per node), every pair run, whether it was interrupted, and what could not be
    removed from nodes (empty when every run key and directory is gone)."""

    rows: tuple[CheckResult, ...]
    runs: tuple[PairRun, ...]
    interrupted: bool
    leftovers: tuple[str, ...]


def _row(run_id: str, node: Node, profile: str, status: Status, code: str, detail: str,
         value: float | None = None, warn: float | None = None, fail: float | None = None,
         duration_s: float = 0.0) -> CheckResult:
    return CheckResult(run_id=run_id, time=_now(), node=node.name, pool=node.pool,
                       profile=profile, check=CHECK_ID, metric=METRIC, value=value, unit="GB/s",
                       warn=warn, fail=fail, status=status, code=code, detail=detail,
                       duration_s=round(duration_s, 3))


def run_fabric(
    nodes: Sequence[Node],
    *,
    run_id: str,
    transport_for: Callable[[Node], Transport],
    concurrency: int = 8,
    accept_unknown_host_keys: bool = False,
    progress: Callable[[PairRun], None] | None = None,
) -> FabricOutcome:
    """The check on ``nodes`` (module docstring). Bad inventory variables raise
    InventoryError before anything runs; KeyboardInterrupt stops the run, removes every run
    key and directory, and returns what was decided (``interrupted``)."""
    rows: list[CheckResult] = []
    by_name = {n.name: n for n in nodes}
    settings: dict[str, PairSettings] = {}
    profiles: dict[str, str] = {n.name: n.profile for n in nodes}
    pools: dict[str, list[str]] = {}
    for node in nodes:
        try:
            profile = profile_for(node)
            found = pair_settings(node, profile)
        except ProfileError as exc:
            rows.append(_row(run_id, node, node.profile, Status.ERROR, CODE_PROFILE, str(exc)))
            continue
        profiles[node.name] = profile.name
        if isinstance(found, str):
            rows.append(_row(run_id, node, profile.name, Status.SKIP, "ok", found))
            continue
        settings[node.name] = found
        pools.setdefault(node.pool, []).append(node.name)
    for pool, names in list(pools.items()):
        if len(names) < 2:
            node = by_name[names[0]]
            rows.append(_row(run_id, node, profiles[node.name], Status.SKIP, "ok",
                             f"the only node of pool {pool} in this run: no peer to pair with"))
            del pools[pool]
    for names in pools.values():
        names.sort()

    executor = PairExecutor(by_name, run_id, transport_for, accept_unknown_host_keys)
    first: list[PairRun] = []
    second: list[PairRun] = []
    leftovers: dict[str, list[str]] = {}
    interrupted = False
    problems: list[str] = []
    try:
        jobs = []
        for pool, names in pools.items():
            pairs, leftovers[pool] = first_pass(names)
            jobs += [(a, b, settings[a]) for a, b in pairs]
        first = executor.run_wave(jobs, 1, concurrency, progress)
        rounds: list[list[tuple[str, str, PairSettings]]] = []
        for pool, names in pools.items():
            tri = triage(names, [r for r in first if r.pool == pool], leftovers[pool])
            for i, pairs in enumerate(second_pass(tri.retest, tri.good)):
                while len(rounds) <= i:
                    rounds.append([])
                rounds[i] += [(a, b, settings[a]) for a, b in pairs]
        for jobs in rounds:
            second += executor.run_wave(jobs, 2, concurrency, progress)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        try:
            problems = executor.sweep()
        finally:
            if interrupted:
                # A worker may still hold its connection until its command ends; closing it
                # would wait for that, so it is closed once free, off this thread.
                threading.Thread(target=executor.close, daemon=True).start()
            else:
                executor.close()
    for pool, names in pools.items():
        decided = verdicts(names, [r for r in first if r.pool == pool],
                           [r for r in second if r.pool == pool], leftovers.get(pool, []))
        for name in names:
            v = decided[name]
            undecided = interrupted and v.status is not Status.PASS and v.status is not Status.WARN
            rows.append(_row(
                run_id, by_name[name], profiles[name],
                Status.ERROR if undecided else v.status,
                CODE_INTERRUPTED if undecided else v.code,
                ("interrupted before its verdict; " + v.detail) if undecided else v.detail,
                v.busbw_gbps, v.warn, v.fail, sum(r.duration_s for r in v.runs)))
    order = {n.name: i for i, n in enumerate(nodes)}
    rows.sort(key=lambda r: order[r.node])
    return FabricOutcome(tuple(rows), (*first, *second), interrupted, tuple(problems))


PAIR_COLUMNS = ("pass", "pool", "launcher", "peer", "status", "code", "busbw_gbps", "warn",
                "fail", "duration_s", "time", "detail")


def write_pair_table(run_dir: Path, runs: Sequence[PairRun]) -> Path:
    """``fabric_pairs.csv``: every pair run of the check, in run order."""
    path = run_dir / "fabric_pairs.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(PAIR_COLUMNS)
        for r in runs:
            out.writerow([r.pass_no, r.pool, r.launcher, r.peer, r.status.value, r.code,
                          "" if r.busbw_gbps is None else f"{r.busbw_gbps:g}",
                          "" if r.warn is None else f"{r.warn:g}",
                          "" if r.fail is None else f"{r.fail:g}",
                          f"{r.duration_s:.3f}", r.time, r.detail])
    return path
