"""The check framework: a check is a stable id + the commands it needs + a parser + an
evaluation against the node's profile, yielding :class:`Verdict` rows.

Commands go through :class:`NodeContext`, which runs each tool once per node per run (the
``nvidia-smi -q -x`` output serves every gpu.* check) and turns the ways a tool can fail into a
:class:`ToolFailure` with a stable code. The runner turns a ToolFailure into an ``error`` (or,
for a known node fault such as "driver not loaded", a ``fail``) row, and a
:class:`~validate.transport.TransportError` into unreachable rows for every remaining check.
"""

from __future__ import annotations

import math
import re
import shlex
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar, cast

from validate.inventory import Node
from validate.model import (
    CODE_EXIT,
    CODE_NON_FINITE,
    CODE_NOT_FOUND,
    CODE_OUTPUT_LIMIT,
    CODE_PARSE,
    CODE_SUDO_DENIED,
    CODE_TIMEOUT,
    Status,
)
from validate.parsers import ParseError
from validate.profiles import Band, Profile
from validate.transport import CommandResult, Transport, TransportError, Unresponsive

T = TypeVar("T")

# nvidia-smi's stdout, exit status 9, when the kernel module is not loaded (real capture:
# fixtures/nvidia-smi-nodriver/).
_NO_DRIVER = re.compile(r"couldn't communicate with the NVIDIA driver", re.IGNORECASE)
CODE_DRIVER_NOT_LOADED = "gpu.driver.not_loaded"
# How long ``true`` may take to answer after a command timed out (NodeContext): the SSH step
# budget's default.
DEFAULT_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judged figure of a check: becomes one result row."""

    metric: str
    status: Status
    code: str
    detail: str = ""
    value: float | None = None
    unit: str = ""
    warn: float | None = None
    fail: float | None = None


def judged(
    metric: str, value: float, unit: str, band: Band, code: str, detail: str = ""
) -> Verdict:
    """A verdict for ``value`` against ``band``; ``code`` is used when it is not a pass.
    A NaN or infinite value is an ``error`` row: it compares false to every limit, so it would
    otherwise pass any band."""
    if not math.isfinite(value):
        return Verdict(metric, Status.ERROR, CODE_NON_FINITE,
                       f"{value!r} is not a measurement" + (f" ({detail})" if detail else ""),
                       None, unit, band.warn, band.fail)
    status = band.judge(value)
    return Verdict(
        metric,
        status,
        "ok" if status is Status.PASS else code,
        detail,
        value,
        unit,
        band.warn,
        band.fail,
    )


def expect_equal(metric: str, got: object, want: object, code: str, detail: str = "") -> Verdict:
    """pass when ``got == want`` else fail with ``code``; numbers also land in ``value``."""
    ok = got == want
    value = float(got) if isinstance(got, int | float) and not isinstance(got, bool) else None
    text = detail or f"expected {want}, found {got}"
    return Verdict(
        metric,
        Status.PASS if ok else Status.FAIL,
        "ok" if ok else code,
        "" if ok and not detail else text,
        value,
    )


class ToolFailure(Exception):
    """A command or its output could not give the check an answer.

    ``status`` is ``error`` for tool trouble, or ``fail`` for a node fault the failure itself
    proves (nvidia-smi cannot talk to the driver)."""

    def __init__(self, code: str, detail: str, status: Status = Status.ERROR) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status


@dataclass
class NodeContext:
    """Everything a check may use on one node during one run.

    A tool that timed out once on this node is not started again there: a hung ``nvidia-smi``
    hangs for ``-q -x``, ``topo -m`` and ``nvlink -s`` alike, and each would cost a full
    timeout. Later commands of that tool raise a ``tool.timeout`` ToolFailure saying so.

    A command that times out asks whether the node itself still answers: ``true``, within
    ``probe_timeout_s``. A node that does not answer that either has stopped answering
    commands altogether (it accepts them and never replies): the timed-out command raises
    :class:`~validate.transport.Unresponsive` (``host.unresponsive``, exit 3), and the runner
    gives every later check that row at once instead of one full timeout per tool. Where the
    transport runs two commands at once, the probe is sent beside a command still running
    ``probe_timeout_s`` before its timeout (at half of it at the earliest), so that the verdict
    is in when the timeout fires: the node costs that one timeout; otherwise it is sent after
    the timeout.

    :meth:`prefetch` starts a command a later check will run beside the checks that run now,
    when the transport can run two at once: a node whose tools all hang then costs one timeout,
    not one per tool, and a healthy node one round trip less. :meth:`settle` waits for what
    was started (the runner calls it before the node's connection is closed)."""

    run_id: str
    node: Node
    profile: Profile
    transport: Transport
    default_timeout_s: float
    _cache: dict[tuple[str, ...], CommandResult | TransportError] = field(default_factory=dict)
    _timed_out: dict[str, str] = field(default_factory=dict)
    _parsed: dict[tuple[object, tuple[str, ...]], object] = field(default_factory=dict)
    _started: dict[tuple[str, ...], Future[CommandResult]] = field(default_factory=dict)
    _gone: TransportError | None = None
    # Seconds the liveness probe after a timeout may take (None: no probe).
    probe_timeout_s: float | None = DEFAULT_PROBE_TIMEOUT_S
    _probe_lock: threading.Lock = field(default_factory=threading.Lock)
    _probe: tuple[float, Future[CommandResult | TransportError]] | None = None
    _silent: TransportError | None = None
    # This node's latest earlier value of each (check, metric) that asked for history (a
    # check with ``wants_history``), with its row's time (ISO 8601): from the run history
    # under the reports root (validate.history.last_values); empty on a first run.
    previous: Mapping[tuple[str, str], tuple[float, str]] = field(default_factory=dict)

    def gone(self, error: TransportError) -> None:
        """The node cannot be asked any more: every later command raises ``error`` without
        touching the transport, except one that was prefetched, whose own answer (it ran
        beside the command that failed, and may have ended first) is kept."""
        if self._gone is None:
            self._gone = error

    @property
    def gone_error(self) -> TransportError | None:
        return self._gone

    def prefetch(self, argv: Sequence[str], *, tool: str | None = None,
                 root: bool = False) -> None:
        """Start ``argv`` (with the default timeout, cached) in a thread of its own now, when
        the transport says it can run two commands at once (``concurrent_runs``); otherwise do
        nothing and the command runs when its check asks for it. The check's own
        :meth:`run` or :meth:`output` of the same argv then waits for this one and gets its
        result, or its error, exactly as if it had run it itself."""
        if not getattr(self.transport, "concurrent_runs", False):
            return
        plain = tuple(argv)
        key = self.as_root(plain) if root else plain
        if key in self._cache or key in self._started:
            return
        started: Future[CommandResult] = Future()
        self._started[key] = started

        def work() -> None:
            try:
                started.set_result(self._run(plain, key, tool, None, cached=True))
            except BaseException as exc:  # handed to the check that asks for it
                started.set_exception(exc)

        threading.Thread(target=work, name=f"validate-{self.node.name}-{plain[0]}",
                         daemon=True).start()

    def settle(self) -> None:
        """Wait for every prefetched command (each is bounded by its timeout, and an abort of
        the transport ends it at once); their errors were, or are no longer, anyone's."""
        for started in self._started.values():
            started.exception()

    def run(
        self,
        argv: Sequence[str],
        timeout: float | None = None,
        *,
        cached: bool = True,
        tool: str | None = None,
        root: bool = False,
    ) -> CommandResult:
        """Run argv (once per node per run when ``cached``). Transport errors propagate, and a
        cached transport error is raised again without retrying. ``tool`` names what runs
        (default ``argv[0]``; a script names the tool it drives) for the timed-out rule.
        ``root``: the command needs root; with ansible_become it runs through ``sudo -n``."""
        plain = tuple(argv)
        key = self.as_root(plain) if root else plain
        if cached and key in self._started:
            return self._started[key].result()  # its error is raised here
        if self._gone is not None:
            raise self._gone
        return self._run(plain, key, tool, timeout, cached=cached)

    def _run(self, plain: tuple[str, ...], key: tuple[str, ...], tool: str | None,
             timeout: float | None, *, cached: bool) -> CommandResult:
        tool = tool or (plain[0] if plain else None)
        if cached and key in self._cache:
            hit = self._cache[key]
            if isinstance(hit, TransportError):
                raise hit
            return hit
        name = tool or (key[0] if key else "?")
        if name in self._timed_out:
            raise ToolFailure(
                CODE_TIMEOUT,
                f"not started: {name} already timed out on this node ({self._timed_out[name]})",
            )
        seconds = timeout or self.default_timeout_s
        started = time.monotonic()
        early = None
        if self.probe_timeout_s is not None and getattr(self.transport, "concurrent_runs", False):
            # Not before half the command's timeout: most commands are over by then, and a
            # probe beside each of them would double what a node is asked.
            lead = max(seconds - self.probe_timeout_s, seconds / 2)
            early = threading.Timer(lead, self._probe_since, (started,))
            early.daemon = True
            early.start()
        try:
            result = self.transport.run(key, seconds)
        except TransportError as exc:
            if cached:
                self._cache[key] = exc
            raise
        finally:
            if early is not None:
                early.cancel()
        if result.timed_out:
            self._timed_out[name] = f"{shlex.join(key)[:80]} killed after {result.duration_s:.1f} s"
            try:
                self._still_answering(name, result, started)
            except TransportError as exc:
                if cached:
                    self._cache[key] = exc
                raise
        if cached:
            self._cache[key] = result
        return result

    def _probe_since(self, since: float) -> Future[CommandResult | TransportError]:
        """The liveness probe (``true``) sent at or after ``since``: the one under way or done,
        else a new one in a thread of its own. One node sends one probe at a time."""
        with self._probe_lock:
            if self._probe is not None and self._probe[0] >= since:
                return self._probe[1]
            answer: Future[CommandResult | TransportError] = Future()
            self._probe = (time.monotonic(), answer)
        assert self.probe_timeout_s is not None

        def work(budget: float) -> None:
            try:
                answer.set_result(self.transport.run(("true",), budget))
            except TransportError as exc:
                answer.set_result(exc)
            except BaseException as exc:  # handed to whoever waits for the verdict
                answer.set_exception(exc)

        threading.Thread(target=work, args=(self.probe_timeout_s,), daemon=True,
                         name=f"validate-{self.node.name}-probe").start()
        return answer

    def _still_answering(self, name: str, timed_out: CommandResult, since: float) -> None:
        """After ``name`` (started at ``since``) timed out: raise the node's TransportError when
        a ``true`` sent since then got no answer either (see the class docstring); return when
        it did (only the tool hangs). Once the node is known silent, every caller gets that."""
        if self.probe_timeout_s is None:
            return
        if self._silent is None:
            probe = self._probe_since(since).result()
            if isinstance(probe, CommandResult) and not probe.timed_out:
                return
            silent = probe if isinstance(probe, TransportError) else Unresponsive(
                self.node.name,
                f"stopped answering commands: {name} got no answer within "
                f"{timed_out.duration_s:.1f} s, nor `true` within {probe.duration_s:.1f} s; "
                "its remaining checks were not started")
            with self._probe_lock:
                if self._silent is None:
                    self._silent = silent
        raise self._silent

    def as_root(self, argv: Sequence[str]) -> tuple[str, ...]:
        """argv as a command that needs root runs: through ``sudo -n -u <become user> --``
        when the inventory becomes (ansible_become), else unchanged (the login user runs it;
        as root when ansible_user is root). ``-n``: sudo never waits for a password."""
        user = self.node.become_user
        if user is None or user == self.node.user:  # already logged in as that user
            return tuple(argv)
        return ("sudo", "-n", "-u", user, "--", *argv)

    def output(
        self,
        argv: Sequence[str],
        timeout: float | None = None,
        *,
        ok_rcs: tuple[int, ...] = (0,),
        cached: bool = True,
        root: bool = False,
    ) -> CommandResult:
        """Like :meth:`run`, but a timeout, too much output, a missing tool, sudo's refusal or
        an exit status outside ``ok_rcs`` raises :class:`ToolFailure`."""
        plain = tuple(argv)
        result = self.run(plain, timeout, cached=cached, root=root)
        check_result(result, plain[0] if plain else None)
        if result.argv != plain:  # run through sudo
            _check_sudo(result, plain, self.node.user)
        tool = plain[0] if plain else "?"
        if result.rc in ok_rcs:
            return result
        if tool == "nvidia-smi" and _NO_DRIVER.search(result.stdout + result.stderr):
            raise ToolFailure(
                CODE_DRIVER_NOT_LOADED,
                "nvidia-smi cannot communicate with the NVIDIA driver (module not loaded)",
                Status.FAIL,
            )
        if result.rc == 127:
            raise ToolFailure(CODE_NOT_FOUND, f"{tool}: command not found on the node")
        tail = (result.stderr.strip() or result.stdout.strip())[-300:]
        raise ToolFailure(CODE_EXIT, f"{tool} exited {result.rc}: {tail}")

    def parsed_output(self, argv: Sequence[str], parser: Callable[[str], T], what: str) -> T:
        """``parsed(parser, self.output(argv).stdout, what)``, parsed once per node: eight
        gpu.* checks read one ``nvidia-smi -q -x`` (135 KB for 8 GPUs), and parsing it for each
        of them was two thirds of a node's CPU at 1,000 nodes. A parse error is kept and raised
        again, so each check reports it as before."""
        text = self.output(argv).stdout
        key = (parser, tuple(argv))
        if key not in self._parsed:
            try:
                self._parsed[key] = parsed(parser, text, what)
            except ToolFailure as exc:
                self._parsed[key] = exc
        hit = self._parsed[key]
        if isinstance(hit, ToolFailure):
            raise hit
        return cast(T, hit)


def _check_sudo(result: CommandResult, argv: tuple[str, ...], login: str) -> None:
    """ToolFailure naming the command when sudo itself refused it (no passwordless right, no
    sudo on the node); the command's own failures pass through."""
    err = result.stderr.strip()
    if result.rc == 127 and "sudo" in err and "not found" in err:
        raise ToolFailure(CODE_SUDO_DENIED,
                          f"ansible_become is set but sudo is not installed: {shlex.join(argv)} "
                          f"needs root")
    if result.rc == 1 and err.startswith("sudo:"):
        raise ToolFailure(CODE_SUDO_DENIED,
                          f"sudo -n refused {shlex.join(argv)} for {login}: {err[-200:]}")


def check_result(result: CommandResult, tool: str | None = None) -> None:
    """ToolFailure for a command that timed out or printed more than the output cap."""
    name = tool or (result.argv[0] if result.argv else "?")
    if result.timed_out:
        raise ToolFailure(CODE_TIMEOUT, f"{name} killed after {result.duration_s:.1f}s (timeout)")
    if result.truncated:
        lines = result.stdout.strip().splitlines()
        last = lines[-1][-120:] if lines else ""
        raise ToolFailure(
            CODE_OUTPUT_LIMIT,
            f"{name} printed more than the output cap and was killed; output discarded "
            f"(it ended with {last!r})",
        )


def parsed(parser: Callable[[str], T], text: str, what: str) -> T:
    """``parser(text)``, with a ParseError turned into a ToolFailure naming ``what``. Output
    nested deeper than Python's recursion limit (a node printing 100,000 nested brackets) is a
    parse error too, wherever a parser met it."""
    try:
        return parser(text)
    except ParseError as exc:
        raise ToolFailure(CODE_PARSE, f"{what}: {exc}") from exc
    except RecursionError:
        raise ToolFailure(CODE_PARSE, f"{what}: output nested too deeply to parse") from None


class Check(ABC):
    """A validation with a stable id. Subclasses set ``id``, ``title`` and ``evaluate``."""

    id: ClassVar[str]
    title: ClassVar[str]
    # Run order within a node: cheap queries first, long benchmarks last.
    order: ClassVar[int] = 50
    # The check judges against its own rows of the node's previous run (NodeContext.previous).
    wants_history: ClassVar[bool] = False

    def skip_reason(self, ctx: NodeContext) -> str | None:
        """Why this check does not apply to this node's profile (None: it applies)."""
        return None

    def when_named(self) -> Check:
        """This check as run when ``--checks`` names its id exactly (not by a pattern): an
        opt-in check (dcgm.diag_r3) then runs whatever the profile says. Most checks: itself."""
        return self

    def prefetch(self, ctx: NodeContext) -> None:
        """Start, with :meth:`NodeContext.prefetch`, a command this check will run, when it
        can run beside the checks before it (called when the node starts, for checks that
        apply). Most checks have nothing to start."""
        return None

    @abstractmethod
    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        """Run commands through ``ctx`` and judge them. May raise ToolFailure/TransportError."""
