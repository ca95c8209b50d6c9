"""Drift against hostile SSH peers (tests/hostile_ssh.py: a real SSH server process, each
endpoint with a host key of its own), through the real `python -m validate drift` with real
Ansible (ansible-runner, ansible-playbook, OpenSSH) and paramiko:

- host keys: an impostor (its key contradicts known_hosts) and a host whose key is unknown are
  reported unreachable with the key named; nothing reaches either (no authentication, no
  command, from the probes or from Ansible), and no known_hosts file is written (the run's
  HOME, the account's home OpenSSH itself reads, the inventory's file). A peer with its known
  key is reached by both, the proof that the test would see a connection;
- a silent node (it takes commands and never answers) beside a peer that answers: drift ends
  within the documented deadline, the silent node as error rows, the other's rows as they are
  without the silent one;
- SIGTERM or SIGINT while check mode hangs on the silent node: exit 130 within seconds, a
  report marked interrupted, and no process of the run left (ansible-playbook, its workers,
  ssh clients and masters), none reparented to init;
- a Ctrl-C while `python -m validate` is still importing: one line and exit 130;
- peers that speak no SSH: paramiko's tracebacks go to the run's run.log, not to stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ansible_runner
import pandas as pd
import pytest

from tests.conftest import REPO_ROOT
from tests.kube_helpers import TEST_NET
from tests.unit.validate.test_reliability import Fleet, hostile_fleet
from validate.ansible_ssh import NEW_KEYS_FILE, runner_settings
from validate.model import ExitCode

# This module's share of the tests' range (test_reliability uses .100-.199).
NET = "127.0.21.{}"
SILENT = {"behaviour": "slow", "delay_s": 100000}  # exec accepted, no answer, ever


def _specs(*named: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "address": NET.format(220 + i), **spec}
            for i, (name, spec) in enumerate(named)]


def _drift_argv(fleet: Fleet, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "validate", "drift", "-i", str(fleet.inventory),
            "--out", str(out), *extra]


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
         ) -> tuple[subprocess.CompletedProcess[str], float, Path]:
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    took = time.monotonic() - started
    report = next(Path(line[len("report: "):]) for line in proc.stdout.splitlines()
                  if line.startswith("report: "))
    return proc, took, report


def _forget(known_hosts: Path, endpoint: dict[str, Any]) -> Path:
    """Take ``endpoint``'s key out of the known_hosts file the fleet wrote."""
    mine = f"[{endpoint['address']}]:{endpoint['port']} "
    known_hosts.write_text("".join(f"{line}\n" for line in known_hosts.read_text().splitlines()
                                   if not line.startswith(mine)))
    return known_hosts


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A HOME whose Ansible ControlPath (~/.ansible/cp/<hash>) fits in a socket address:
    under pytest's long tmp_path, ssh would fail before connecting and prove nothing."""
    home = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    try:
        yield home
    finally:
        shutil.rmtree(home)


def test_unknown_and_contradicting_host_keys_are_refused_and_nothing_is_written(
        tmp_path: Path, fixtures_dir: Path, short_home: Path) -> None:
    specs = _specs(("impostor", {"behaviour": "wrong_key"}), ("unknown", {"behaviour": "ok"}),
                   ("known", {"behaviour": "ok"}))
    with hostile_fleet(tmp_path, fixtures_dir, specs) as fleet:
        known_hosts = _forget(tmp_path / "known_hosts", fleet.endpoints["unknown"])
        inventory_keys = _sha(known_hosts)
        # OpenSSH reads the account's home from the password database, not $HOME.
        account_file = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"
        account_keys = _sha(account_file)
        proc, _, run = _run(_drift_argv(fleet, tmp_path / "reports", "--timeout", "5",
                                        "--layers", "configuration,versions,runtime"),
                            env={**os.environ, "HOME": str(short_home)})
        table = pd.read_parquet(run / "drift.parquet").set_index(["node", "item"])
        for name in ("impostor", "unknown"):
            # Only TCP and the key exchange: no authentication, no command, from anyone.
            assert {e["event"] for e in fleet.events(name)} <= {"connect", "disconnect"}, name
        assert {"auth", "exec"} <= {e["event"] for e in fleet.events("known")}
        # Ansible itself reached the known peer (its interpreter discovery ran there).
        assert any("python3" in e["command"] for e in fleet.events("known", "exec"))
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr[-2000:]
    for name in ("impostor", "unknown"):
        row = table.loc[(name, "ssh")]
        assert (row["status"], row["actual"]) == ("unreachable", "host.hostkey_rejected")
        # Both the probes (paramiko) and check mode (OpenSSH) refused it: one row.
        assert "probe: ssh" in row["source"] and "check mode" in row["source"]
        assert "SHA256:" in row["detail"]
    assert "host key mismatch" in table.loc[("impostor", "ssh")]["detail"]
    assert "unknown ecdsa-sha2-nistp256 host key" in table.loc[("unknown", "ssh")]["detail"]
    assert not (short_home / ".ssh").exists()
    assert _sha(account_file) == account_keys
    assert _sha(known_hosts) == inventory_keys


def test_a_silent_node_is_given_up_within_its_deadline_and_the_others_are_intact(
        tmp_path: Path, fixtures_dir: Path) -> None:
    specs = _specs(("answers", {"behaviour": "ok"}), ("silent", SILENT))
    task_timeout, timeout = 10, 3
    args = ("--timeout", str(timeout), "--check-task-timeout", str(task_timeout),
            "--layers", "configuration,versions,runtime")
    with hostile_fleet(tmp_path, fixtures_dir, specs) as fleet:
        alone, alone_s, alone_run = _run(_drift_argv(fleet, tmp_path / "a", "--limit",
                                                     "answers", *args))
        both, both_s, both_run = _run(_drift_argv(fleet, tmp_path / "b", *args))
        time.sleep(1)
        # No connection to the silent node outlives the run (the check-mode ssh master and
        # its waiting client included).
        events = fleet.events("silent")
    print(f"\ndrift: the answering node alone {alone_s:.1f} s; with a silent node "
          f"{both_s:.1f} s (check-mode task timeout {task_timeout} s)", file=sys.__stderr__)
    # The documented bound: a silent node costs at most its check-mode task timeout (the
    # probes give it up after one --timeout, in parallel), plus ssh's connect time.
    assert both_s <= alone_s + task_timeout + 15, (alone_s, both_s)
    assert len([e for e in events if e["event"] == "connect"]) == len(
        [e for e in events if e["event"] == "disconnect"])
    assert alone.returncode != ExitCode.INTERRUPTED and both.returncode == ExitCode.UNREACHABLE
    table = pd.read_parquet(both_run / "drift.parquet")
    silent = table[table["node"] == "silent"].set_index("item")
    assert set(silent.index) == {"check mode", "ssh"}
    assert silent.loc["check mode", "status"] == "error"
    assert f"per-node deadline of {task_timeout} s" in silent.loc["check mode", "detail"]
    assert (silent.loc["ssh", "status"], silent.loc["ssh", "actual"]) == (
        "unreachable", "host.unresponsive")
    assert "stopped answering" in silent.loc["ssh", "detail"]

    def rows(run: Path) -> set[tuple[str, ...]]:
        t = pd.read_parquet(run / "drift.parquet")
        t = t[(t["node"] == "answers") & (t["layer"] != "configuration")]
        return set(zip(t["layer"], t["item"], t["status"], t["actual"], t["detail"],
                       strict=True))

    def configuration(run: Path) -> list[str]:
        t = pd.read_parquet(run / "drift.parquet")
        return list(t[(t["node"] == "answers") & (t["layer"] == "configuration")]["status"])

    assert rows(both_run) == rows(alone_run) and rows(alone_run)
    # The answering peer has no Python: Ansible's check mode pipes its module into an `sh`
    # that has already answered "command not found", and which of the two Ansible reports
    # (the module failed, or a broken pipe while sending it) is a race inside Ansible that
    # load decides (CI saw both). What must hold: the node keeps its one configuration row,
    # an error either way, with or without a silent neighbour.
    for run in (alone_run, both_run):
        assert len(configuration(run)) == 1 and configuration(run)[0] in (
            "error", "unreachable"), configuration(run)


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _alive(pid: int) -> tuple[bool, int]:
    """(running and not a zombie, parent pid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False, 0
    return fields[0] != "Z", int(fields[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_drift_stops_its_ansible_children_and_writes_what_it_has(
        tmp_path: Path, fixtures_dir: Path, sig: signal.Signals) -> None:
    specs = _specs(("answers", {"behaviour": "ok"}), ("silent", SILENT))
    out = tmp_path / "reports"
    with hostile_fleet(tmp_path, fixtures_dir, specs) as fleet:
        proc = subprocess.Popen(
            _drift_argv(fleet, out, "--timeout", "300", "--check-task-timeout", "300",
                        "--layers", "configuration,versions,runtime", "--run-id", "stopped"),
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Check mode hangs on the silent node (Ansible's first command there is taken and
            # never answered) and so do the probes: now interrupt.
            fleet.wait_for(lambda: [e for e in fleet.events("silent", "exec")
                                    if "python3" in e["command"]], timeout=120)
            fleet.wait_for(lambda: [e for e in fleet.events("silent", "exec")
                                    if "systemd-detect-virt" in e["command"]], timeout=60)
            children = _descendants(proc.pid)
            assert any("ansible-playbook" in _cmdline(p) for p in children), children
            ssh_procs = {p for p in children if _cmdline(p).startswith("ssh")}
            sent = time.monotonic()
            proc.send_signal(sig)
            stdout, stderr = proc.communicate(timeout=60)
            stopped_in = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        time.sleep(1)
        events = fleet.events("silent")
        # Every process the run started is gone, and the ssh masters (daemons of their own)
        # with them: none left under init.
        left = {p: _cmdline(p) for p in children | _ssh_of(fleet) if _alive(p)[0]}
        print(f"\n{sig.name}: drift exited {proc.returncode} {stopped_in:.1f} s after the "
              f"signal ({len(children)} processes of the run, {len(ssh_procs)} of them ssh)",
              file=sys.__stderr__)
    assert left == {}, left
    assert len([e for e in events if e["event"] == "connect"]) == len(
        [e for e in events if e["event"] == "disconnect"])
    assert proc.returncode == ExitCode.INTERRUPTED, stderr[-3000:]
    assert stopped_in < 15, stopped_in
    assert f"interrupted by {sig.name}" in stderr and "Traceback" not in stderr
    assert "INTERRUPTED: a partial drift report" in stdout
    assert "exit: 130 INTERRUPTED" in stdout
    run = out / "stopped"
    meta = json.loads((run / "drift.json").read_text())
    assert (meta["interrupted"], meta["exit_code"], meta["interrupted_by"]) == (
        True, 130, sig.name)
    info = json.loads((run / "run.json").read_text())
    assert (info["run_kind"], info["exit_code"]) == ("drift", 130)
    assert "INTERRUPTED" in (run / "summary.md").read_text()
    table = pd.read_parquet(run / "drift.parquet")
    assert set(table["node"]) == {"answers", "silent"}
    silent = table[table["node"] == "silent"].set_index("item")
    assert silent.loc["check mode", "actual"] == "interrupted"
    assert silent.loc["probes", "actual"] == "interrupted"
    assert not (out / "latest-drift").exists()


def _ssh_of(fleet: Fleet) -> set[int]:
    """ssh processes anywhere on the machine that talk to this fleet's endpoints."""
    ports = {f"Port={e['port']}" for e in fleet.endpoints.values()}
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and _cmdline(int(p.name)).startswith("ssh")
            and any(port in _cmdline(int(p.name)) for port in ports)}


def test_ctrl_c_while_starting_is_one_line_and_exit_130(tmp_path: Path) -> None:
    # The command is short: on an idle machine it can finish between the poll that sees it
    # importing and the signal. Such a try proves nothing either way and is made again.
    for _ in range(5):
        proc, stdout, stderr = _interrupt_while_starting(tmp_path)
        if not (proc.returncode == 0 and stdout):
            break
    assert (proc.returncode, stdout, stderr) == (ExitCode.INTERRUPTED, "", "interrupted\n")


def _interrupt_while_starting(root: Path) -> tuple[subprocess.Popen[str], str, str]:
    """`validate history` sent SIGINT while it imports; the process and its output."""
    proc = subprocess.Popen([sys.executable, "-m", "validate", "history", str(root)],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        # A subcommand imports what it needs when it starts (validate/cli.py): history loads
        # pandas, whose compiled modules come early in an import that goes on for a while more
        # (pyarrow).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            maps = Path(f"/proc/{proc.pid}/maps")
            if "pandas/_libs" in maps.read_text():
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, stdout, stderr


def _adhoc(fleet: Fleet, private: Path, **trust: Any) -> Any:
    private.mkdir()
    return ansible_runner.run(
        private_data_dir=str(private), inventory=str(fleet.inventory), host_pattern="all",
        module="ansible.builtin.raw", module_args="true", quiet=True,
        **runner_settings(fleet.inventory, private, envvars={
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}, **trust))


def test_every_ansible_run_verifies_host_keys_whatever_the_inventory_says(
        tmp_path: Path, fixtures_dir: Path, short_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """validate/ansible_ssh.py for the suite's other Ansible runs (tests, benches): an inventory
    that turns checking off is overruled; accepting unknown keys (opted in) trusts a new key for
    the run only, in a file of the run's own, and never a changed one."""
    monkeypatch.setenv("HOME", str(short_home))
    specs = _specs(("impostor", {"behaviour": "wrong_key"}), ("unknown", {"behaviour": "ok"}))
    user_file = tmp_path / "user_known_hosts"
    with hostile_fleet(tmp_path, fixtures_dir, specs) as fleet:
        known_hosts = _forget(tmp_path / "known_hosts", fleet.endpoints["unknown"])
        with (fleet.inventory / "group_vars" / "all.yml").open("a") as extra:
            extra.write("ansible_host_key_checking: false\n"
                        "ansible_ssh_common_args: -o StrictHostKeyChecking=no "
                        f"-o UserKnownHostsFile={user_file}\n")
        inventory_keys = _sha(known_hosts)
        refused = _adhoc(fleet, tmp_path / "refusing")
        refused_events = {n: {e["event"] for e in fleet.events(n)} for n in fleet.endpoints}
        accepted = _adhoc(fleet, tmp_path / "accepting", accept_unknown_host_keys=True)
        accepted_events = {n: {e["event"] for e in fleet.events(n)} for n in fleet.endpoints}
    assert set(refused.stats["dark"]) == {"impostor", "unknown"}, refused.stats
    assert refused_events == {"impostor": {"connect", "disconnect"},
                              "unknown": {"connect", "disconnect"}}
    # Opted in: the unknown key is taken for this run; the changed one is still refused.
    assert set(accepted.stats["dark"]) == {"impostor"}, accepted.stats
    assert "auth" in accepted_events["unknown"]
    assert accepted_events["impostor"] == {"connect", "disconnect"}
    assert not (tmp_path / "refusing" / NEW_KEYS_FILE).exists()
    taken = (tmp_path / "accepting" / NEW_KEYS_FILE).read_text().splitlines()
    assert len(taken) == 1  # the unknown peer's key, in the run's own file only
    assert not user_file.exists() and _sha(known_hosts) == inventory_keys
    assert not (short_home / ".ssh").exists()


def test_peers_that_speak_no_ssh_leave_stderr_quiet_and_their_log_in_the_run(
        tmp_path: Path, fixtures_dir: Path) -> None:
    """paramiko logs a traceback per peer that speaks no SSH, from its own thread: in a drift
    run it goes to the run's run.log (as in a validation run), and stderr keeps drift's own
    lines."""
    specs = _specs(("garbage-1", {"behaviour": "garbage"}),
                   ("garbage-2", {"behaviour": "garbage"}), ("answers", {"behaviour": "ok"}))
    with hostile_fleet(tmp_path, fixtures_dir, specs) as fleet:
        proc, _, run = _run(_drift_argv(fleet, tmp_path / "reports", "--timeout", "5",
                                        "--layers", "performance", "--perf-checks", "gpu.pcie",
                                        "--run-id", "quiet"))
    assert proc.returncode == ExitCode.UNREACHABLE, proc.stderr
    assert run == tmp_path / "reports" / "quiet"
    assert "Traceback" not in proc.stderr and "paramiko" not in proc.stderr, proc.stderr
    assert all(line.startswith("gpuready drift: ") for line in proc.stderr.splitlines()), \
        proc.stderr
    log = (run / "run.log").read_text()
    assert "paramiko" in log and "Traceback" in log, log
    table = pd.read_parquet(run / "drift.parquet").set_index(["node", "item"])
    for name in ("garbage-1", "garbage-2"):
        assert table.loc[(name, "ssh"), "status"] == "unreachable"


def test_a_nodes_answer_is_printed_escaped_on_its_own_line(tmp_path: Path,
                                                           fixtures_dir: Path) -> None:
    """A node whose `uname -r` answers with terminal escapes and a line of its own (clear the
    screen, home the cursor, ring, then a fake verdict): the real `python -m validate drift`
    prints the kernel's drift with the escapes visible, on one line, and nothing else."""
    fake = "\x1b[2J\x1b[H\x07\nNo drift. exit: 0 OK"
    specs = [{"name": "esc", "address": f"{TEST_NET}.230", "behaviour": "ok",
              "responses": [["uname -r", {"stdout": f"6.1.0-28-amd64{fake}\n"}]]}]
    with hostile_fleet(tmp_path, fixtures_dir, specs,
                       host_vars={"esc": "gpuready_kernel_release: 6.1.0-28-amd64"}) as fleet:
        proc, _, _ = _run(_drift_argv(fleet, tmp_path / "out", "--layers", "versions",
                                      "--timeout", "5", "--check-task-timeout", "10"))
    assert ("DRIFT esc versions kernel: declared 6.1.0-28-amd64, actual 6.1.0-28-amd64"
            "\\x1b[2J\\x1b[H\\x07\\nNo drift. exit: 0 OK (since ") in proc.stdout, proc.stdout
    assert not any(line.startswith("No drift") for line in proc.stdout.splitlines())
    assert not any(c in proc.stdout + proc.stderr for c in "\x1b\x07\r")
