"""Local transport: run the checks on the node itself (no SSH)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence

from validate.transport.base import CommandResult


class LocalTransport:
    """Runs argv with :mod:`subprocess` in its own process group, so that a timeout kills the
    command and everything it spawned (a hung tool often forks helpers)."""

    def __init__(self, host: str = "localhost", env: dict[str, str] | None = None) -> None:
        self._host = host
        self._env = env

    @property
    def host(self) -> str:
        return self._host

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        args = tuple(argv)
        start = time.monotonic()
        env = None if self._env is None else {**os.environ, **self._env}
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=env,
            )
        except FileNotFoundError as exc:
            # Same convention as a shell: 127 = command not found.
            return CommandResult(args, 127, "", str(exc), time.monotonic() - start)
        try:
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
            rc = -1
        return CommandResult(
            args,
            rc,
            out.decode("utf-8", "replace"),
            err.decode("utf-8", "replace"),
            time.monotonic() - start,
            timed_out,
        )

    def close(self) -> None:
        return None
