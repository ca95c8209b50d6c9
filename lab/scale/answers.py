"""What an endpoint prints for a command: the lab simulators' output for its hardware and faults.

A lab host runs the simulators as its tools; an endpoint has no processes, so it answers as a
converged lab host would (nvidia-persistenced running, the pinned driver's module loaded):
``nvidia-smi`` through :func:`lab.sim.nvidia_smi.respond`, the kernel log through
``journalctl -o short-iso`` with the lines :func:`lab.sim.lab_kmsg.xid_lines` injects for its
Xid faults. Anything else is "not found" (exit 127), as on a host without the tool.

The exec request is either the validators' (``exec env LC_ALL=C sh -c <wrapper> gpuready
<timeout> argv...``, validate/transport/ssh.py) or a plain command line (OpenSSH's ``ssh host
nvidia-smi -q -x``); :func:`parse_command` reads both.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lab import hardware
from lab.paths import REPO_ROOT
from lab.scale.plan import Endpoint
from lab.sim import lab_kmsg
from lab.sim import nvidia_smi as smi

# The driver the lab pins (inventory/lab/group_vars/all/bootstrap.yml): the version a converged
# lab host's nvidia-smi reports, so gpu.driver passes as on the lab.
_BOOTSTRAP = REPO_ROOT / "inventory/lab/group_vars/all/bootstrap.yml"


def pinned_driver(path: Path = _BOOTSTRAP) -> str:
    return str(yaml.safe_load(path.read_text())["nvidia_driver_version"])


@dataclass(frozen=True, slots=True)
class Answer:
    stdout: str
    rc: int
    hang: bool = False  # the tool never returns (tool-hang)


@dataclass(frozen=True, slots=True)
class Command:
    argv: tuple[str, ...]
    timeout_s: float | None  # the wrapper's wall clock, when the validators sent one


def parse_command(command: str) -> Command:
    try:
        words = shlex.split(command)
    except ValueError:
        return Command((command,), None)
    # exec env LC_ALL=C sh -c <wrapper> gpuready <timeout> argv...
    if words[:5] == ["exec", "env", "LC_ALL=C", "sh", "-c"] and len(words) >= 8 \
            and words[6] == "gpuready":
        try:
            return Command(tuple(words[8:]), float(words[7]))
        except ValueError:
            return Command(tuple(words[8:]), None)
    return Command(tuple(words), None)


class Host:
    """One endpoint's simulated hardware and the answers it gives."""

    def __init__(self, endpoint: Endpoint, driver: str) -> None:
        self.endpoint = endpoint
        self.driver = driver
        self.hw: dict[str, Any] = hardware.render_host(endpoint.hw_profile, endpoint.name)
        self._cache: dict[tuple[str, ...], Answer] = {}

    def answer(self, argv: tuple[str, ...]) -> Answer:
        """The command's output; nvidia-smi's data output is rendered once and kept (the
        harness answers 1,000 endpoints from one process)."""
        cached = self._cache.get(argv)
        if cached is None:
            cached = self._cache[argv] = self._render(argv)
        return cached

    def _render(self, argv: tuple[str, ...]) -> Answer:
        faults = set(self.endpoint.faults)
        tool = argv[0] if argv else ""
        if tool == "nvidia-smi":
            if "tool-hang" in faults:
                return Answer("", -1, hang=True)
            out, rc = smi.respond(list(argv[1:]), self.driver, faults, lambda: self.hw,
                                  lambda _version: None, persistenced=True)
            return Answer(out, rc)
        if tool == "journalctl":
            return Answer(self._journal(faults), 0)
        return Answer(f"sh: 1: {tool}: not found\n", 127)

    def _journal(self, faults: set[str]) -> str:
        lines = [line for fault in lab_kmsg.XID_FAULTS if fault in faults
                 for line in lab_kmsg.xid_lines(fault, self.hw)]
        if not lines:
            return "-- No entries --\n"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 60))
        return "".join(f"{stamp} {self.endpoint.name} kernel: {line}\n" for line in lines)
