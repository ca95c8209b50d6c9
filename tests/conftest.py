"""Shared test fixtures: where the real captured tool output lives.

The real captures the tests read are kept in the repository (``tests/fixtures/``, one row per
file in ``tests/fixtures/SOURCES.tsv`` with its source, commit and licence), so a clone anywhere
passes its own tests. ``GPUREADY_FIXTURES`` points the tests at another copy (for example a
newer ``../shared/fixtures``).
"""

from __future__ import annotations

import os
import socket
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
