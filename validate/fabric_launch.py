"""One pair run of ``fabric.nccl_pair``: all_reduce_perf across two nodes, launched the way
real clusters launch it, and what its output says.

The launcher (the pair's first node) runs Open MPI's ``mpirun``, which starts the peer's
ranks over SSH. That hop uses a key made for this run only, on the launcher
(``ssh-keygen`` there, so the private key never leaves the node that uses it), installed in
the peer's ``~/.ssh/authorized_keys`` as::

    from="<launcher's source address>",expiry-time="<now + timeout>",restrict ssh-ed25519 ... \
gpuready-fabric:<run>:<launcher>:

and removed again when the pair is done, failed or interrupted (:class:`KeyLedger` remembers
what is still out there for the final sweep). ``from=`` is the address the launcher's kernel
picks to reach the peer (``ip route get``), ``expiry-time`` is computed by the peer's own
clock, ``restrict`` refuses forwarding and ptys. The peer's host key comes from the control
node's known_hosts (the one the validators verify against), so the node-to-node hop checks
host keys too. No lasting trust between nodes is left behind.

Every remote step is a fixed ``sh -c`` script whose inventory data arrive as positional
arguments (argv, never a shell string built from inventory data).

Output of :func:`judge_output`: a :class:`RunVerdict` (status, code, busbw, detail and
``blame``: the node an error belongs to by itself, such as a launcher without ``mpirun``, or
None when the pair's failure cannot tell which node caused it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from threading import Lock

import paramiko

from validate.inventory import Node
from validate.model import (
    CODE_EXIT,
    CODE_IMPLAUSIBLE,
    CODE_NOT_FOUND,
    CODE_PARSE,
    CODE_TIMEOUT,
    Status,
)
from validate.parsers import ParseError, nccl
from validate.profiles import CEILING_BUSBW_GBPS, Band
from validate.transport import CommandResult
from validate.transport.ssh import load_known_hosts

CODE_LOW = "fabric.nccl_pair.low_busbw"
CODE_WRONG = "fabric.nccl_pair.wrong_results"
CODE_LAUNCH = "fabric.nccl_pair.launch_failed"
CODE_NODE_SSH = "fabric.nccl_pair.node_ssh_failed"
CODE_NOT_MULTINODE = "fabric.nccl_pair.not_multinode"

KEY_COMMENT_PREFIX = "gpuready-fabric"
# Seconds the launcher's own `timeout` gives mpirun after TERM before KILL, and the margin the
# transport adds on top (its KILL is the backstop; TERM lets mpirun stop the peer's daemons).
KILL_AFTER_S = 5
TRANSPORT_MARGIN_S = 15.0
# Seconds a cleanup waits for what it TERMed (the launcher's timeout and mpirun, the peer's
# orted) before it KILLs: past timeout's own KILL, so that mpirun has had its chance.
CLEANUP_WAIT_S = KILL_AFTER_S + 3

# On the launcher: make the run's directory and key, write the peer's host keys, say where
# things are. $1 key comment, $2 peer address, $3 known_hosts lines for the peer, $4 the
# directory to make (a name the caller chose, so that it is known even if this step dies;
# mkdir without -p refuses a name that already exists, whoever made it).
LAUNCHER_SETUP = r"""set -eu
umask 077
dir=$4
mkdir -m 700 -- "$dir"
echo "dir=$dir"
ssh-keygen -q -t ed25519 -N '' -C "$1" -f "$dir/id_ed25519" </dev/null >/dev/null
printf '%s\n' "$3" > "$dir/known_hosts"
addr=$(getent ahosts "$2" | awk 'NR == 1 {print $1}')
echo "src=$(ip -o route get "${addr:-$2}" | sed -n 's/.* src \([^ ]*\).*/\1/p')"
echo "hostname=$(hostname)"
echo "pubkey=$(cat "$dir/id_ed25519.pub")"
"""

# On the peer: append the run key with its restrictions. $1 public key line, $2 lifetime in
# seconds (the peer's clock sets the expiry), $3 the launcher's source address.
PEER_INSTALL = r"""set -eu
umask 077
[ -d "$HOME/.ssh" ] || mkdir -m 700 "$HOME/.ssh"
f="$HOME/.ssh/authorized_keys"
expiry=$(date -d "+$2 seconds" +%Y%m%d%H%M)
# A last line without its newline would swallow the key appended after it.
if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then printf '\n' >> "$f"; fi
printf 'from="%s",expiry-time="%s",restrict %s\n' "$3" "$expiry" "$1" >> "$f"
"""

# Shell: whether process $1 runs (a zombie awaiting its parent does not).
_ALIVE = r"""alive() {
  [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
"""

# On the peer: first stop what this run left running there (Open MPI's orted/prted whose command
# line names one of the run's directories, $2, and their children: TERM, then KILL after $3
# seconds, and wait until they are gone); then remove every line carrying the tag $1, keeping
# the file's owner and mode and every other line; a file without the tag is not touched. Only
# this user's processes are looked at, and only those naming the run's directory, so nothing
# else on the node is signalled.
PEER_REMOVE = r"""set -eu
""" + _ALIVE + r"""if [ -n "${2:-}" ]; then
  procs=""
  for p in $(pgrep -u "$(id -u)" -x 'orted|prted' || true); do
    if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$2"; then
      procs="$procs $p $(pgrep -P "$p" || true)"
    fi
  done
  any_alive() { for q in $procs; do alive "$q" && return 0; done; return 1; }
  if [ -n "$procs" ]; then
    kill -TERM $procs 2>/dev/null || true
    i=0
    while [ "$i" -lt "$((${3:-10} * 2))" ] && any_alive; do sleep 0.5; i=$((i + 1)); done
    kill -KILL $procs 2>/dev/null || true
    # A KILLed process is gone only once the kernel has run it down: wait for that too.
    i=0
    while [ "$i" -lt 20 ] && any_alive; do sleep 0.1; i=$((i + 1)); done
  fi
fi
f="$HOME/.ssh/authorized_keys"
[ -f "$f" ] || exit 0
grep -qF -- "$1" "$f" || exit 0
if [ -L "$f" ]; then f=$(readlink -f "$f"); fi
tmp=$(mktemp "$f.gpuready.XXXXXX")
rc=0
grep -vF -- "$1" "$f" > "$tmp" || rc=$?
if [ "$rc" -gt 1 ]; then rm -f -- "$tmp"; exit "$rc"; fi
chmod --reference="$f" -- "$tmp"
chown --reference="$f" -- "$tmp" 2>/dev/null || true
mv -f -- "$tmp" "$f"
"""

# On the launcher: stop the pair's mpirun if it still runs, then remove the run's directory and
# its private key. $1 the directory, $2 seconds to wait after TERM. The pid file names the
# launcher's `timeout`, which leads the process group mpirun and its local rank run in: TERM to
# it (timeout passes it on, and mpirun stops its daemons on the peer), wait until it is gone,
# then KILL what is left of the group. A pid that no longer names the directory (it ended and the
# number was reused) is not signalled, and a group id stays taken while any member lives.
# Returns only once nothing of the pair runs here (zombies awaiting their parent do not count).
LAUNCHER_CLEANUP = r"""set -u
case "$1" in */gpuready-fabric.*) ;; *) echo "refusing to remove $1" >&2; exit 2 ;; esac
""" + _ALIVE + r"""
group_alive() {
  for q in $(pgrep -g "$1" || true); do alive "$q" && return 0; done
  return 1
}
pid=$(cat "$1/mpirun.pid" 2>/dev/null || true)
case "$pid" in ''|*[!0-9]*) pid="" ;; esac
if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$1"; then
  kill -TERM "$pid" 2>/dev/null || true
  i=0
  while [ "$i" -lt "$((${2:-10} * 2))" ] && alive "$pid"; do sleep 0.5; i=$((i + 1)); done
  if group_alive "$pid"; then
    kill -KILL "-$pid" 2>/dev/null || true
    i=0
    while [ "$i" -lt 20 ] && group_alive "$pid"; do sleep 0.1; i=$((i + 1)); done
  fi
fi
rm -rf -- "$1"
"""

# Runs the mpirun command line given as arguments after recording its pid for the cleanup.
# $1 the run's directory, then argv.
LAUNCH = 'echo $$ > "$1/mpirun.pid"; shift; exec "$@"'

_NO_SPACE = re.compile(r"^\S+$")
_SAFE_TAG = re.compile(r"[^A-Za-z0-9._-]")


class LaunchError(Exception):
    """A launch step could not be done. ``blame`` names the node at fault, if one is."""

    def __init__(self, code: str, detail: str, blame: str | None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.blame = blame


@dataclass(frozen=True, slots=True)
class PairSettings:
    """How a pool runs its pair test (profile ``thresholds.nccl_pair`` + inventory vars)."""

    gpus: int
    size_bytes: int
    iters: int
    warmup_iters: int
    timeout_s: float
    band: Band
    nccl_env: tuple[tuple[str, str], ...] = ()
    mca: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LauncherInfo:
    """What the launcher's setup script reported."""

    run_dir: str
    hostname: str
    source_address: str
    public_key: str


@dataclass(frozen=True, slots=True)
class RunVerdict:
    """What one pair run's output says about the pair."""

    status: Status
    code: str
    busbw_gbps: float | None
    detail: str
    blame: str | None = None


def key_tag(run_id: str, launcher: str = "") -> str:
    """The comment that marks this run's keys, or one launcher's keys of this run. The run's
    tag is a prefix of each launcher's; the closing colon keeps node1's from matching node10's."""
    tag = f"{KEY_COMMENT_PREFIX}:{_SAFE_TAG.sub('_', run_id)}:"
    return f"{tag}{_SAFE_TAG.sub('_', launcher)}:" if launcher else tag


def known_hosts_lines(peer: Node) -> list[str]:
    """The peer's host keys from the known_hosts file the validators verify it against, as
    known_hosts lines for the launcher. Empty when the file has none for it."""
    if peer.known_hosts is None:
        return []
    name = peer.address if peer.port == 22 else f"[{peer.address}]:{peer.port}"
    store = paramiko.HostKeys()
    try:
        known = load_known_hosts(peer.known_hosts)
    except OSError:
        return []
    for entry_name, key in known.entries:
        store.add(entry_name, key.get_name(), key)
    # HostKeys.lookup matches hashed (|1|...) names as well as plain ones.
    found: Mapping[str, paramiko.PKey] = store.lookup(name) or {}
    return [f"{name} {key_type} {key.get_base64()}" for key_type, key in found.items()]


def parse_launcher_setup(result: CommandResult, launcher: str) -> LauncherInfo:
    """The setup script's ``key=value`` lines; raises LaunchError naming what is missing."""
    fields: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("dir", "src", "hostname", "pubkey"):
            fields[key] = value.strip()
    run_dir = fields.get("dir", "")
    if result.rc != 0 or result.timed_out:
        tail = (result.stderr.strip() or result.stdout.strip())[-300:]
        code = CODE_TIMEOUT if result.timed_out else (
            CODE_NOT_FOUND if "not found" in tail else CODE_EXIT)
        raise LaunchError(code, f"preparing the run key on {launcher} failed "
                          f"(exit {result.rc}): {tail}", launcher)
    missing = [k for k in ("dir", "src", "hostname", "pubkey") if not fields.get(k)]
    if missing:
        raise LaunchError(CODE_EXIT, f"{launcher} did not report {', '.join(missing)} "
                          "(is iproute2's `ip` there, and does the peer's address resolve?)",
                          launcher)
    return LauncherInfo(run_dir, fields["hostname"], fields["src"], fields["pubkey"])


def mpirun_argv(
    settings: PairSettings,
    launcher_hostname: str,
    peer: Node,
    run_dir: str,
    strict_host_keys: bool,
) -> list[str]:
    """The launcher's command: Open MPI's mpirun, one process per node driving all its GPUs
    (``-g``), the peer reached over SSH with the run key, the pool's MCA parameters and NCCL
    environment. The launcher is named by its own hostname (how Open MPI recognises the local
    node), the peer by its inventory address. Its own `timeout` TERMs mpirun at the pool's
    timeout, so that mpirun can stop the peer's daemons before anything is killed."""
    ssh_args = [
        "-i", f"{run_dir}/id_ed25519",
        "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={'yes' if strict_host_keys else 'accept-new'}",
        "-o", f"UserKnownHostsFile={run_dir}/known_hosts",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=10",
        "-o", "LogLevel=ERROR",
        "-p", str(peer.port),
        "-l", peer.user,
    ]
    # Open MPI splits plm_rsh_args on blanks and knows no quoting.
    bad = [a for a in ssh_args if not _NO_SPACE.match(a)]
    if bad:
        raise LaunchError(CODE_EXIT, f"ssh arguments for {peer.name} contain blanks: {bad}", None)
    argv = [
        "timeout", "-k", str(KILL_AFTER_S), f"{settings.timeout_s:g}",
        "mpirun", "--allow-run-as-root",
        "-np", "2", "--host", f"{launcher_hostname}:1,{peer.address}:1",
        "--mca", "plm_rsh_agent", "ssh",
        "--mca", "plm_rsh_args", " ".join(ssh_args),
    ]
    for name, value in settings.mca:
        argv += ["--mca", name, value]
    for name, value in settings.nccl_env:
        argv += ["-x", f"{name}={value}"]
    size = str(settings.size_bytes)
    argv += [
        "all_reduce_perf", "-b", size, "-e", size, "-f", "2", "-g", str(settings.gpus),
        "-c", "1", "-n", str(settings.iters), "-w", str(settings.warmup_iters),
    ]
    return argv


def launch_argv(run_dir: str, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that its pid lands in the run's directory (for the cleanup)."""
    return ["sh", "-c", LAUNCH, "sh", run_dir, *argv]


_ORTED_MISSING = re.compile(r"orted: (?:command )?not found|orted: No such file")
_DAEMONS_FAILED = re.compile(r"ORTE was unable to reliably start one or more daemons"
                             r"|ORTE does not know how to route")
_SSH_FAILED = re.compile(r"Permission denied \(publickey|Host key verification failed"
                         r"|REMOTE HOST IDENTIFICATION HAS CHANGED|Connection refused"
                         r"|Connection timed out|No route to host|Could not resolve hostname")


def judge_output(
    result: CommandResult, settings: PairSettings, launcher: str, peer: str
) -> RunVerdict:
    """What mpirun's result says about the pair (see the module docstring)."""
    pair = f"{launcher}-{peer}"
    text = result.stdout + "\n" + result.stderr
    # `timeout` exits 124 after TERM (137 after its KILL); the transport marks its own kill.
    if result.timed_out or result.rc in (124, 137):
        return RunVerdict(
            Status.ERROR, CODE_TIMEOUT, None,
            f"all_reduce_perf across {pair} did not finish within the pool's "
            f"{settings.timeout_s:g} s: a rank never completed (a peer's NCCL bootstrap or "
            "collective hangs)")
    if result.rc == 127 and "mpirun" in text:
        return RunVerdict(Status.ERROR, CODE_NOT_FOUND,
                          None, f"mpirun (Open MPI) not found on {launcher}", blame=launcher)
    if _ORTED_MISSING.search(text):
        return RunVerdict(Status.ERROR, CODE_NOT_FOUND, None,
                          f"orted (Open MPI) not found on {peer}: mpirun on {launcher} could "
                          "not start the peer's daemon", blame=peer)
    ssh = _SSH_FAILED.search(text)
    if ssh:
        return RunVerdict(Status.ERROR, CODE_NODE_SSH, None,
                          f"mpirun on {launcher} could not log in to {peer} with the run key: "
                          f"{ssh.group(0)}")
    if _DAEMONS_FAILED.search(text):
        return RunVerdict(Status.ERROR, CODE_LAUNCH, None,
                          f"mpirun on {launcher} could not start its daemon on {peer}: "
                          f"{_tail(result)}")
    try:
        run = nccl.parse_text(result.stdout)
    except ParseError as exc:
        code = CODE_EXIT if result.rc not in (0,) else CODE_PARSE
        return RunVerdict(Status.ERROR, code, None,
                          f"all_reduce_perf across {pair} exited {result.rc}: {exc.reason}")
    wrong = sum(r.wrong or 0 for r in run.rows) + (run.out_of_bounds or 0)
    if result.rc != 0 and not wrong:
        # nccl-tests exits 1 for wrong results; a table without any from a run that failed
        # (a rank that crashed after it, mpirun's own error) is no measurement.
        return RunVerdict(Status.ERROR, CODE_EXIT, None,
                          f"all_reduce_perf across {pair} exited {result.rc} with no wrong "
                          f"results in its table: {_tail(result)}")
    return judge_run(run, settings, pair)


def judge_run(run: nccl.NcclRun, settings: PairSettings, pair: str) -> RunVerdict:
    """Busbw at the largest size against the pool's band; any wrong value fails."""
    if len(run.hosts) < 2:
        return RunVerdict(Status.ERROR, CODE_NOT_MULTINODE, None,
                          f"all_reduce_perf for {pair} ran on {len(run.hosts)} host(s) "
                          f"({', '.join(run.hosts)}): not a multi-node measurement")
    if not run.rows:
        return RunVerdict(Status.ERROR, CODE_PARSE, None,
                          f"all_reduce_perf across {pair} printed no results")
    largest = run.largest_row
    busbw = largest.busbw_gbps
    wrong = sum(r.wrong or 0 for r in run.rows) + (run.out_of_bounds or 0)
    ranks = len(run.devices)
    where = f"{largest.size_bytes} B over {ranks} ranks on {' + '.join(run.hosts)}"
    if wrong:
        return RunVerdict(Status.FAIL, CODE_WRONG, busbw,
                          f"{wrong} wrong/out-of-bounds values ({where}): data corruption")
    if not busbw <= CEILING_BUSBW_GBPS:
        return RunVerdict(Status.ERROR, CODE_IMPLAUSIBLE, None,
                          f"{busbw:g} GB/s at {where} is above the {CEILING_BUSBW_GBPS:g} GB/s "
                          "any GPU interconnect carries: not a measurement")
    status = settings.band.judge(busbw)
    limit = settings.band.fail if status is Status.FAIL else settings.band.warn
    detail = f"{busbw:g} GB/s at {where}"
    if status is not Status.PASS:
        detail += f", below {limit:g}"
    return RunVerdict(status, "ok" if status is Status.PASS else CODE_LOW, busbw, detail)


def _tail(result: CommandResult) -> str:
    lines = [x.strip() for x in (result.stderr + "\n" + result.stdout).splitlines()
             if x.strip() and not x.startswith("----")]
    return " | ".join(lines[-4:])[-300:]


@dataclass
class KeyLedger:
    """What this run left on nodes and has not yet removed: key tags per peer and run
    directories per launcher. Thread-safe; the final sweep removes whatever is left."""

    keys: dict[str, set[str]] = field(default_factory=dict)
    dirs: dict[str, set[str]] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def add_key(self, peer: str, tag: str) -> None:
        with self._lock:
            self.keys.setdefault(peer, set()).add(tag)

    def has_key(self, peer: str, tag: str) -> bool:
        """Whether the peer may carry a key tagged ``tag`` or a tag that starts with it."""
        with self._lock:
            return any(t.startswith(tag) for t in self.keys.get(peer, set()))

    def drop_key(self, peer: str, tag: str) -> None:
        """Forget ``tag`` and every tag that starts with it."""
        with self._lock:
            held = self.keys.get(peer, set())
            held -= {t for t in held if t.startswith(tag)}

    def has_dir(self, launcher: str, run_dir: str) -> bool:
        with self._lock:
            return run_dir in self.dirs.get(launcher, set())

    def add_dir(self, launcher: str, run_dir: str) -> None:
        with self._lock:
            self.dirs.setdefault(launcher, set()).add(run_dir)

    def drop_dir(self, launcher: str, run_dir: str) -> None:
        with self._lock:
            self.dirs.get(launcher, set()).discard(run_dir)

    def outstanding(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        with self._lock:
            return ({n: sorted(t) for n, t in self.keys.items() if t},
                    {n: sorted(d) for n, d in self.dirs.items() if d})


def remote_argv(script: str, *args: str) -> list[str]:
    """A fixed script with its data as positional arguments (``$1``...)."""
    return ["sh", "-c", script, KEY_COMMENT_PREFIX, *args]


__all__ = [
    "CODE_LAUNCH",
    "CODE_LOW",
    "CODE_NODE_SSH",
    "CODE_NOT_MULTINODE",
    "CODE_WRONG",
    "KeyLedger",
    "LaunchError",
    "LauncherInfo",
    "PairSettings",
    "RunVerdict",
    "judge_output",
    "judge_run",
    "key_tag",
    "known_hosts_lines",
    "launch_argv",
    "mpirun_argv",
    "parse_launcher_setup",
    "remote_argv",
]
