"""Shared test fixtures: where the real captured tool output lives; each module's wall time.

The real captures the tests read are kept in the repository (``tests/fixtures/``, one row per
file in ``tests/fixtures/SOURCES.tsv`` with its source, commit and licence), so a clone anywhere
passes its own tests. ``GPUREADY_FIXTURES`` points the tests at another copy (for example a
newer ``../shared/fixtures``).

With ``GPUREADY_TEST_TIMES=FILE`` a session writes each test module's wall time (its tests,
fixtures and teardowns) and its own into FILE as JSON; ``make test`` ends with the table
``python -m tools.ci_times`` makes of them (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
IN_REPO_FIXTURES = REPO_ROOT / "tests" / "fixtures"


def _fixtures_root() -> Path:
    env = os.environ.get("GPUREADY_FIXTURES")
    return Path(env) if env else IN_REPO_FIXTURES


FIXTURES = _fixtures_root()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real captures (tests/fixtures); tests that need them fail loudly if absent."""
    if not FIXTURES.is_dir():
        pytest.fail(f"real fixtures not found at {FIXTURES} (unset GPUREADY_FIXTURES?)")
    return FIXTURES


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then released): connecting is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


_MODULE_WALL_S: dict[str, float] = {}
_SESSION_STARTED = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's whole protocol (setup, call, teardown: module fixtures included) counts to
    its module: the tests of a session run one after another, so the sums are wall times."""
    started = time.monotonic()
    yield
    module = str(Path(str(item.fspath)).relative_to(REPO_ROOT))
    _MODULE_WALL_S[module] = _MODULE_WALL_S.get(module, 0.0) + time.monotonic() - started


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("GPUREADY_TEST_TIMES")
    if not target or hasattr(session.config, "workerinput"):
        return
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(json.dumps({
        "session_s": round(time.monotonic() - _SESSION_STARTED, 1),
        "exit_status": int(exitstatus),
        "modules_s": {m: round(s, 1) for m, s in _MODULE_WALL_S.items()},
    }, indent=1) + "\n")
