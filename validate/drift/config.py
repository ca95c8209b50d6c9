"""Configuration layer: the bootstrap roles in check mode with --diff, read from ansible-runner's
events per host and task.

Check mode asks every role what it *would* change, and Ansible's modules answer without
changing anything (apt simulates, templates compare checksums, systemd reads unit state). Each
changed task becomes a finding, placed in the layer its module belongs to:

- files (copy, template, file, lineinfile, replace, blockinfile, get_url): ``configuration``,
  item = the path, ``detail`` = the diff (suppressed for ``no_log`` tasks and secret paths);
- packages (apt): the declared ``name=version`` pins are collected for the versions layer,
  which compares them with the node's dpkg database; a changed apt task with no package found
  to differ still becomes a finding with apt's own summary;
- holds (dpkg_selections): ``versions``, item ``hold <name>``;
- services (systemd_service, service): ``runtime``, item ``service <unit>``;
- anything else that would change (a command that would run): ``configuration``,
  item ``<role>: <task>``.

A failed assert is the role's own verification saying the node is not what it declares: a
finding in the role's layer. Ansible stops a failed host there, so the finding says that later
roles were not compared on that node. Any other failure is an ``error``; an unreachable host is
``unreachable`` (a host key that is unknown or contradicts known_hosts is said in one line
naming the key). Handlers are consequences of changes already reported and are skipped.

Bounds: every task has a per-node deadline (``task_timeout_s``, Ansible's task timeout): a node
that stops answering (an SSH channel that takes commands and never replies) is given up on the
task it hangs in, as one ``error`` row (item ``check mode``), and Ansible goes on with the
others, whose findings are intact. The whole pass has ``timeout_s``; ``cancel`` (SIGINT/SIGTERM
in the CLI) stops it within a second: ansible-runner kills ansible-playbook's process group,
and the run's ssh masters (their sockets in a directory of the run's own) are told to exit, so
no process of the pass outlives it.

Host keys: the pass verifies them exactly as the validators do and writes no known_hosts file
(validate/ansible_ssh.py).

Output: :class:`CheckModeResult`.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validate import ansible_ssh
from validate.drift.model import DEFAULT_TASK_TIMEOUT_S, Finding, FindingStatus, Layer

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO_ROOT / "playbooks" / "bootstrap.yml"
CHECK_MODE_ITEM = "check mode"

# Paths whose diffs are never shown, whatever the task says: key material and kubeconfigs.
DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    "*/pki/*",
    "*.key",
    "*.pem",
    "*/kubelet.conf",
    "*/bootstrap-kubelet.conf",
    "*/admin.conf",
    "*secret*",
    "*token*",
    "*password*",
    "*credentials*",
)
HIDDEN = "(diff hidden: secret)"
# Lines of a diff kept in a finding; the rest is counted, not shown.
MAX_DIFF_LINES = 60

_FILE_ACTIONS = frozenset(
    {"copy", "template", "file", "lineinfile", "replace", "blockinfile", "get_url", "ini_file"}
)
_SERVICE_ACTIONS = frozenset({"systemd_service", "systemd", "service"})
_ASSERT_ACTIONS = frozenset({"assert", "fail"})
# The layer a role's failed verification belongs to.
ROLE_LAYERS: dict[str, Layer] = {
    "preflight": Layer.CONFIGURATION,
    "gpu_kernel_prereqs": Layer.RUNTIME,
    "nvidia_driver": Layer.VERSIONS,
    "nvidia_dcgm": Layer.VERSIONS,
    "containerd": Layer.RUNTIME,
    "nvidia_container_toolkit": Layer.RUNTIME,
    "kubelet": Layer.VERSIONS,
    "gpu_validation_tools": Layer.VERSIONS,
}


@dataclass(frozen=True, slots=True)
class PackageTask:
    """An apt task as check mode saw it on one host: the declared packages
    (name -> exact version, ``""`` for "any version", ``None`` for absent)."""

    role: str
    task: str
    packages: Mapping[str, str | None]
    changed: bool
    summary: str


@dataclass
class CheckModeResult:
    """What one check-mode run found. ``hosts`` are the hosts that reported at all."""

    rc: int
    status: str
    elapsed_s: float
    findings: list[Finding] = field(default_factory=list)
    package_tasks: dict[str, list[PackageTask]] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    stopped: dict[str, str] = field(default_factory=dict)  # host -> the task it stopped at
    left_running: list[str] = field(default_factory=list)  # ssh masters that would not exit


_NO_KEY = re.compile(r"No (\S+) host key is known for (\S+)")
_SENT_KEY = re.compile(r"fingerprint for the (\S+) key sent by the remote host is\s+(\S+)")
_OFFENDING = re.compile(r"Offending (\S+) key in (\S+)")


def host_key_problem(message: str) -> str:
    """OpenSSH's refusal of a host key, in one line naming the key; ``""`` for any other
    message. (OpenSSH names no fingerprint for an unknown key; the probes' line does.)"""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in message:
        sent = _SENT_KEY.search(message)
        offending = _OFFENDING.search(message)
        key = f"{sent.group(1)} key {sent.group(2).rstrip('.')}" if sent else "host key"
        known = (f"; known_hosts has another ({offending.group(1)} key at "
                 f"{offending.group(2)})" if offending else "")
        return f"host key rejected: the node presents {key}, not the one known{known}"
    unknown = _NO_KEY.search(message)
    if unknown:
        return (f"host key rejected: no {unknown.group(1)} host key of {unknown.group(2)} is "
                "in known_hosts (strict checking: nothing was sent to the node)")
    return ""


def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def is_secret(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) for p in patterns)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return "".join(f"{k}: {v}\n" for k, v in sorted(value.items()) if k != "path")
    return str(value)


def render_diff(diff: Any, path: str) -> tuple[str, str, str]:
    """(declared, actual, unified diff) from a module's ``diff`` result (a dict or a list of
    them, with ``before``/``after`` as text or as attribute dicts)."""
    parts = diff if isinstance(diff, list) else [diff] if isinstance(diff, dict) else []
    lines: list[str] = []
    declared: list[str] = []
    actual: list[str] = []
    for part in parts:
        if not isinstance(part, dict) or ("before" not in part and "after" not in part):
            if isinstance(part, dict) and part.get("prepared"):
                lines.append(str(part["prepared"]).rstrip("\n"))
            continue
        before, after = part.get("before"), part.get("after")
        if isinstance(before, dict) or isinstance(after, dict):
            b = before if isinstance(before, dict) else {}
            a = after if isinstance(after, dict) else {}
            for key in sorted(set(a) - {"path"}):
                if b.get(key) != a.get(key):
                    declared.append(f"{key} {a.get(key)}")
                    actual.append(f"{key} {b.get(key, 'unset')}")
        elif before != after:
            declared.append("content as managed")
            actual.append("absent" if not before else "content differs")
        lines += difflib.unified_diff(
            _text(before).splitlines(),
            _text(after).splitlines(),
            # The module's own after_header is a temporary path on the control node.
            f"{part.get('before_header') or path} (on the node)",
            f"{path} (declared)",
            lineterm="",
        )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[:MAX_DIFF_LINES], f"... {len(lines) - MAX_DIFF_LINES} more lines"]
    return (", ".join(declared) or "as managed", ", ".join(actual) or "differs",
            "\n".join(lines))


def _module_args(res: Mapping[str, Any]) -> dict[str, Any]:
    inv = res.get("invocation") or {}
    args = inv.get("module_args") if isinstance(inv, dict) else None
    return dict(args) if isinstance(args, dict) else {}


def _package_specs(args: Mapping[str, Any]) -> dict[str, str | None]:
    names = args.get("name") or args.get("package") or []
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    absent = args.get("state") == "absent"
    out: dict[str, str | None] = {}
    for spec in names:
        name, _, version = str(spec).partition("=")
        out[name.strip()] = None if absent else version.strip()
    return out


def _apt_summary(res: Mapping[str, Any]) -> str:
    """apt's simulation lines (``Inst pkg [installed] (candidate ...)``), else its summary."""
    inst = [ln for ln in str(res.get("stdout") or "").splitlines()
            if ln.startswith(("Inst ", "Remv "))]
    if inst:
        return "\n".join(inst[:20])
    diff = res.get("diff")
    prepared = diff.get("prepared") if isinstance(diff, dict) else None
    return str(prepared or res.get("msg") or "").strip()[:500]


class EventReader:
    """Turns ansible-runner events into findings (see module docstring)."""

    def __init__(self, pools: Mapping[str, str],
                 secret_patterns: Sequence[str] = DEFAULT_SECRET_PATTERNS) -> None:
        self.pools = pools
        self.secret_patterns = tuple(secret_patterns)
        self.result = CheckModeResult(rc=0, status="", elapsed_s=0.0)
        self._handlers: set[str] = set()

    def feed(self, events: Iterable[Mapping[str, Any]]) -> CheckModeResult:
        for event in events:
            self.event(event)
        return self.result

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_handler_task_start":
            self._handlers.add(str(data.get("task_uuid", "")))
            return
        host = data.get("host")
        if not host or host not in self.pools:
            return
        self.result.hosts.add(host)
        # Handlers run because a reported change notified them (a restart after a file edit):
        # consequences, not drift of their own. ansible-runner marks them by their file.
        if (str(data.get("task_uuid", "")) in self._handlers
                or "/handlers/" in str(data.get("task_path", ""))):
            return
        res = data.get("res") or {}
        if kind == "runner_on_unreachable":
            msg = str(res.get("msg", "")).strip()
            problem = host_key_problem(msg)
            self._add(host, Layer.CONFIGURATION, "ssh", "reachable", "unreachable",
                      FindingStatus.UNREACHABLE, f"{problem}\n{msg}" if problem else msg, data)
        elif kind == "runner_on_failed" and res.get("timedout"):
            self._timed_out(host, data, res)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self._failed(host, data, res)
        elif kind == "runner_on_ok":
            self._ok(host, data, res)

    def _add(self, host: str, layer: Layer, item: str, declared: str, actual: str,
             status: FindingStatus, detail: str, data: Mapping[str, Any]) -> None:
        source = f"check mode: {data.get('role') or 'play'} / {data.get('task', '')}"
        self.result.findings.append(Finding(host, self.pools[host], layer, item, declared,
                                            actual, status, detail, source))

    def _timed_out(self, host: str, data: Mapping[str, Any], res: Mapping[str, Any]) -> None:
        timed = res.get("timedout")
        period = timed.get("period") if isinstance(timed, dict) else None
        role = str(data.get("role") or "play")
        task = str(data.get("task") or "")
        self.result.stopped[host] = f"{role}: {task}"
        self._add(host, Layer.CONFIGURATION, CHECK_MODE_ITEM,
                  f"each task answers within {period or '?'} s", "stopped answering",
                  FindingStatus.ERROR,
                  f"the node gave no result for {role} / {task} within the per-node deadline "
                  f"of {period or '?'} s (Ansible's task timeout); check mode gave up on it "
                  "(later tasks and roles not compared) and went on with the other nodes", data)

    def _failed(self, host: str, data: Mapping[str, Any], res: Mapping[str, Any]) -> None:
        role = str(data.get("role") or "play")  # a play's own task (Gathering Facts) has none
        task = str(data.get("task") or "")
        action = _short(str(data.get("resolved_action") or data.get("task_action") or ""))
        msg = str(res.get("msg", "")).strip()
        items = [str(r.get("msg", "")) for r in res.get("results", []) or []
                 if isinstance(r, dict) and r.get("failed")]
        message = " ".join([msg, *items]).strip()[:1000]
        self.result.stopped[host] = f"{role}: {task}"
        note = " (check mode stopped here on this node: later tasks and roles not compared)"
        if action in _ASSERT_ACTIONS:
            self._add(host, ROLE_LAYERS.get(role, Layer.CONFIGURATION), f"{role}: {task}",
                      "role verification passes", "fails", FindingStatus.DRIFT,
                      message + note, data)
        else:
            self._add(host, Layer.CONFIGURATION, f"{role}: {task}", "task succeeds",
                      f"{action} failed", FindingStatus.ERROR, message + note, data)

    def _ok(self, host: str, data: Mapping[str, Any], res: Mapping[str, Any]) -> None:
        action = _short(str(data.get("resolved_action") or data.get("task_action") or ""))
        results = res.get("results")
        if action == "apt":
            args = _module_args(res)
            if args:
                self.result.package_tasks.setdefault(host, []).append(PackageTask(
                    str(data.get("role") or ""), str(data.get("task") or ""),
                    _package_specs(args), bool(res.get("changed")), _apt_summary(res)))
            return
        if isinstance(results, list):  # a loop: one result per item
            for one in results:
                if isinstance(one, dict) and one.get("changed"):
                    self._changed(host, action, data, one)
        elif res.get("changed"):
            self._changed(host, action, data, res)

    def _changed(self, host: str, action: str, data: Mapping[str, Any],
                 res: Mapping[str, Any]) -> None:
        args = _module_args(res)
        censored = "censored" in res or res.get("_ansible_no_log")
        if action == "dpkg_selections":
            name = str(args.get("name") or res.get("item") or "?")
            self._add(host, Layer.VERSIONS, f"hold {name}" if args.get("selection") == "hold"
                      else f"selection {name}", str(args.get("selection", "?")),
                      str(res.get("before", "?")), FindingStatus.DRIFT, "", data)
        elif action in _SERVICE_ACTIONS:
            if args.get("state") in ("restarted", "reloaded"):
                return  # always "changed": an action, not a state the node can drift from
            name = str(args.get("name") or res.get("name") or "?")
            raw = res.get("status")
            status: dict[str, Any] = raw if isinstance(raw, dict) else {}
            want = [f"{k} {args[k]}" for k in ("state", "enabled", "masked")
                    if args.get(k) is not None]
            have = [f"{k}={status[k]}" for k in ("ActiveState", "UnitFileState")
                    if status.get(k)]
            unit = name if "." in name else f"{name}.service"
            self._add(host, Layer.RUNTIME, f"service {unit}", ", ".join(want) or "as managed",
                      ", ".join(have) or "differs", FindingStatus.DRIFT, "", data)
        elif action in _FILE_ACTIONS:
            path = str(args.get("dest") or args.get("path") or res.get("dest")
                       or res.get("path") or "?")
            if censored:
                self._add(host, Layer.CONFIGURATION, path, "(hidden: no_log)",
                          "(hidden: no_log)", FindingStatus.DRIFT,
                          "diff hidden: the task is no_log", data)
                return
            declared, actual, diff = render_diff(res.get("diff"), path)
            if is_secret(path, self.secret_patterns):
                diff = HIDDEN
            self._add(host, Layer.CONFIGURATION, path, declared, actual, FindingStatus.DRIFT,
                      diff, data)
        else:
            what = "(hidden: no_log)" if censored else str(
                res.get("msg") or args.get("cmd") or args.get("argv") or action)
            self._add(host, Layer.CONFIGURATION,
                      f"{data.get('role') or 'play'}: {data.get('task', '')}",
                      "nothing to do", f"would change ({action})", FindingStatus.DRIFT,
                      what[:500], data)


def run_check_mode(
    inventory: Path,
    pools: Mapping[str, str],
    *,
    limit: str | None = None,
    playbook: Path = BOOTSTRAP,
    timeout_s: int = 3600,
    task_timeout_s: int = DEFAULT_TASK_TIMEOUT_S,
    forks: int | None = None,
    secret_patterns: Sequence[str] = DEFAULT_SECRET_PATTERNS,
    accept_unknown_host_keys: bool = False,
    cancel: Callable[[], bool] | None = None,
) -> CheckModeResult:
    """Run ``playbook`` with ``--check --diff`` on the hosts in ``pools`` and read its events
    (bounds, cancelling and host keys: module docstring).

    ansible-runner's private directory is temporary: its artifacts hold the hosts' module
    output (diffs included), which must not outlive the run. Blocking; call from a thread to
    overlap it with the probes."""
    import ansible_runner  # noqa: PLC0415  (heavy import, only for drift runs)

    started = time.monotonic()
    reader = EventReader(pools, secret_patterns)
    with tempfile.TemporaryDirectory(prefix="gpuready-drift-") as private:
        scratch = Path(private) / "ssh"
        control = scratch / "cp"
        control.mkdir(parents=True)
        env = {
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_TASK_TIMEOUT": str(task_timeout_s),
        }
        settings = ansible_ssh.runner_settings(
            inventory.resolve(), scratch, envvars=env, limit=limit or ",".join(sorted(pools)),
            accept_unknown_host_keys=accept_unknown_host_keys, control_dir=control)
        try:
            runner = ansible_runner.run(
                private_data_dir=private,
                project_dir=str(REPO_ROOT),
                playbook=str(playbook),
                inventory=str(inventory.resolve()),  # ansible-runner runs elsewhere
                limit=limit or ",".join(sorted(pools)),
                cmdline="--check --diff",
                forks=forks,
                timeout=timeout_s,
                quiet=True,
                # How often ansible-runner looks at `cancel` (its default is 5 s).
                settings={"pexpect_timeout": 1},
                cancel_callback=cancel or (lambda: False),
                **settings,
            )
        finally:
            # ansible-playbook's process group is gone; its ssh masters (daemons of their own,
            # kept ControlPersist seconds) and any client still waiting on a silent node are not.
            reader.result.left_running = ansible_ssh.stop_masters(control)
        reader.feed(runner.events)
        result = reader.result
        result.rc = int(runner.rc if runner.rc is not None else -1)
        result.status = str(runner.status)
        tail = ""
        if set(pools) - result.hosts:
            try:
                tail = runner.stdout.read()[-1500:].strip()
            except (OSError, AttributeError):
                tail = ""
    result.elapsed_s = time.monotonic() - started
    canceled = result.status == "canceled"
    for host in sorted(pools):
        if host in result.hosts and not (canceled and host not in result.stopped):
            continue
        if not canceled:
            why = (f"ansible-playbook --check ended {result.status} (rc {result.rc}) without a "
                   f"result for this node: {tail}")
        elif host in result.hosts:
            why = ("interrupted: check mode stopped before it finished on this node (the "
                   "findings it made so far are kept)")
        else:
            why = "interrupted: check mode stopped before this node's first result"
        result.findings.append(Finding(
            host, pools[host], Layer.CONFIGURATION, CHECK_MODE_ITEM, "run on the node",
            "interrupted" if canceled else "no result", FindingStatus.ERROR, why,
            "check mode"))
    return result
