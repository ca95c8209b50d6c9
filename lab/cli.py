"""`python -m lab up|down|status|fault|faults|login`: the simulated GPU fleet on this machine.

Every error is one line naming the problem (exit 2); a failed `up` leaves nothing running and a
refused `up` on a running lab leaves that lab as it was.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import TextIO

from lab import controlplane, core, hardware, hosts, logins, repo, snapshot
from lab.errors import LabError
from lab.paths import LabPaths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description="gpuready lab: a SIMULATED GPU fleet of real Debian hosts (systemd-nspawn, "
                    "one loopback address and sshd each).")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot the fleet and write inventory/lab/hosts.yml")
    up.add_argument("--fleet", default="default",
                    help="lab/fleets/<name>.yml or a path (default: default)")
    up.add_argument("--nodes", type=int, help="spread N hosts over the fleet's pools")
    up.add_argument("--fault", action="append", default=[], metavar="HOST=FAULT[,FAULT]",
                    help="inject faults (repeatable); see `python -m lab faults`")
    up.add_argument("--repo-port", type=int, default=repo.DEFAULT_PORT,
                    help=f"lab package repository port on 127.0.0.1 (default {repo.DEFAULT_PORT})")
    up.add_argument("--ssh-port", type=int, default=22, help="sshd port of every host")
    up.add_argument("--converged", action="store_true",
                    help="boot each GPU host from its converged snapshot where one was taken "
                         "(`python -m lab snapshot`); site.yml then re-converges it")
    down = sub.add_parser("down", help="stop every host and server, unmount everything")
    down.add_argument("--snapshots", action="store_true",
                      help="also remove the converged snapshots of this lab directory")
    snap = sub.add_parser("snapshot", help="take a converged host's disk as the snapshot other "
                                           "hosts of its kind boot from (`up --converged`)")
    snap.add_argument("host")
    sub.add_parser("status", help="hosts, addresses, pools and injected faults")
    fault = sub.add_parser("fault", help="change a running host's faults")
    fault.add_argument("host")
    fault.add_argument("faults", nargs="*", help="faults to add")
    fault.add_argument("--remove", action="append", default=[], metavar="FAULT")
    fault.add_argument("--clear", action="store_true", help="remove every fault")
    sub.add_parser("faults", help="list the faults the lab can inject")
    login = sub.add_parser("login", help="log into a running host as an unprivileged user with "
                                         "passwordless sudo, root login refused")
    login.add_argument("host")
    login.add_argument("--user", default=logins.LOGIN_USER)
    login.add_argument("--no-sudo", action="store_true", help="give the user no sudo right")
    return parser


def main(argv: list[str] | None = None, stdout: TextIO = sys.stdout,
         stderr: TextIO = sys.stderr) -> int:
    args = _parser().parse_args(argv)
    if stdout is sys.stdout:  # `python -m lab status | head` ends quietly, like other tools
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    paths = LabPaths.default()
    try:
        if args.command == "up":
            started = time.monotonic()
            state = core.up(paths, fleet=args.fleet, nodes=args.nodes, faults=args.fault,
                            repo_port=args.repo_port, ssh_port=args.ssh_port,
                            converged=args.converged)
            print(f"lab: {len(state.hosts)} hosts up in {time.monotonic() - started:.1f} s "
                  f"(SIMULATED GPUs); inventory: {paths.inventory_dir / 'hosts.yml'}",
                  file=stdout)
            _print_status(paths, state, stdout)
        elif args.command == "down":
            stopped = core.down(paths)
            print(f"lab: stopped {stopped} hosts; nothing of the lab is running", file=stdout)
            if args.snapshots:
                print(f"lab: removed {snapshot.remove_all(paths)} converged snapshot(s)",
                      file=stdout)
        elif args.command == "snapshot":
            started = time.monotonic()
            taken = core.take_snapshot(paths, args.host)
            print(f"lab: {args.host}'s disk is snapshot {taken.name} "
                  f"({time.monotonic() - started:.1f} s; the host was halted and booted again)",
                  file=stdout)
        elif args.command == "status":
            state = core.running_state(paths)
            if state is None:
                print("lab: not running", file=stdout)
            else:
                _print_status(paths, state, stdout)
        elif args.command == "fault":
            if not (args.faults or args.remove or args.clear):
                raise LabError("fault: name faults to add, --remove FAULT or --clear")
            host = core.set_faults(paths, args.host, args.faults, args.remove, args.clear)
            print(f"lab: {host.name} faults: {', '.join(host.faults) or 'none'}", file=stdout)
        elif args.command == "login":
            logins.user_login(paths, args.host, args.user, sudo=not args.no_sudo)
            print(f"lab: {args.host} takes logins as {args.user} "
                  f"({'no sudo' if args.no_sudo else 'passwordless sudo'}); root login refused; "
                  f"set ansible_user: {args.user} and ansible_become: true for it", file=stdout)
        elif args.command == "faults":
            width = max(map(len, hardware.FAULTS))
            for name, what in sorted(hardware.FAULTS.items()):
                print(f"{name:<{width}}  {what}", file=stdout)
    except LabError as exc:
        print(f"lab: error: {exc}", file=stderr)
        return 2
    except KeyboardInterrupt:
        print("lab: interrupted", file=stderr)
        return 130
    return 0


def _print_status(paths: LabPaths, state: core.LabState, out: TextIO) -> None:
    print(f"repository: {repo.repo_url(state.repo_port)} (SIMULATED vendor packages)", file=out)
    for line in controlplane.status_lines(paths, state.hosts):
        print(line, file=out)
    rows = [("HOST", "ADDRESS", "OS", "POOL", "HARDWARE (simulated)", "STATE", "FAULTS")]
    for h in state.hosts:
        alive = hosts.leader_pid(paths, h.name) is not None
        faults = hosts.read_faults(paths, h.name) if alive else h.faults
        booted = f" (from snapshot {state.snapshots[h.name]})" if h.name in state.snapshots else ""
        rows.append((h.name, f"{h.address}:{h.port}", h.os, h.pool,
                     h.hw_profile or "control plane (no GPUs)",
                     ("running" if alive else "stopped") + booted, ",".join(faults) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
