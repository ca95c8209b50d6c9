"""Local transport: run the checks on the node itself (no SSH)."""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from validate.transport.base import DEFAULT_MAX_OUTPUT_BYTES, Aborted, CommandResult
from validate.transport.capture import Capture

# The environment variable that marks a command's processes (see LocalTransport).
SESSION_MARKER = "GPUREADY_SESSION"


class LocalTransport:
    """Runs argv with :mod:`subprocess` in its own process group, so that a timeout (or too
    much output, or :meth:`abort`) kills the command and everything it spawned (a hung tool
    often forks helpers). Output is read from both pipes as it comes, up to the cap.

    A child that calls setsid() leaves the process group; so the command runs with
    ``GPUREADY_SESSION=<token>`` in its environment, which its descendants inherit, and when
    it has ended every process still carrying that token is killed (the SSH transport's
    remote wrapper does the same on the node)."""

    def __init__(
        self,
        host: str = "localhost",
        env: dict[str, str] | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self._host = host
        self._env = env
        self._max_output = max_output_bytes
        self._state = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._aborted: Aborted | None = None

    @property
    def host(self) -> str:
        return self._host

    def run(self, argv: Sequence[str], timeout: float) -> CommandResult:
        args = tuple(argv)
        start = time.monotonic()
        token = f"{os.getpid()}.{secrets.token_hex(8)}"
        env = {**os.environ, **(self._env or {}), SESSION_MARKER: token}
        with self._state:
            if self._aborted is not None:
                raise self._aborted
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
            self._proc = proc
        try:
            return self._collect(proc, args, timeout, start)
        finally:
            with self._state:
                self._proc = None
            _kill_group(proc)
            proc.wait()
            kill_marked(f"{SESSION_MARKER}={token}")

    def _collect(
        self, proc: subprocess.Popen[bytes], args: tuple[str, ...], timeout: float, start: float
    ) -> CommandResult:
        assert proc.stdout is not None and proc.stderr is not None
        capture = Capture(self._max_output)
        deadline = start + timeout
        timed_out = False
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "out")
            sel.register(proc.stderr, selectors.EVENT_READ, "err")
            # Both pipes to EOF before the exit status: a tool may print after its last
            # child exits, and its last line is often the one that matters.
            while sel.get_map() and not capture.over:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(min(remaining, 0.5)):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        capture.out(data)
                    else:
                        capture.err(data)
        if timed_out or capture.over:
            _kill_group(proc)
        else:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
        with self._state:
            if self._aborted is not None:
                raise self._aborted
        rc = -1 if timed_out or capture.over else proc.wait()
        return CommandResult(
            args,
            rc,
            capture.stdout(),
            capture.stderr(),
            time.monotonic() - start,
            timed_out,
            capture.over,
        )

    def close(self) -> None:
        return None

    def abort(self, code: str, reason: str) -> None:
        with self._state:
            if self._aborted is None:
                self._aborted = Aborted(self._host, reason, code)
            proc = self._proc
        if proc is not None:
            _kill_group(proc)


def kill_marked(marker: str, rounds: int = 5) -> list[int]:
    """SIGKILL every process whose environment holds ``marker`` (``NAME=value``), in a few
    rounds (one may fork while the others die); the pids found. Processes of other users, and
    systems without /proc, are out of reach."""
    want = marker.encode()
    found: list[int] = []
    for _ in range(rounds):
        pids = []
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/environ", "rb") as f:
                        if want in f.read().split(b"\0"):
                            pids.append(int(entry.name))
                except OSError:  # gone, or not ours to read
                    continue
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        found += pids
    return found


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
