"""Shared test fixtures: where the real captured tool output lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _fixtures_root() -> Path:
    env = os.environ.get("GPUREADY_FIXTURES")
    if env:
        return Path(env)
    return REPO_ROOT.parent / "shared" / "fixtures"


FIXTURES = _fixtures_root()


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The real captures (../shared/fixtures); tests that need them fail loudly if absent."""
    if not FIXTURES.is_dir():
        pytest.fail(f"real fixtures not found at {FIXTURES} (set GPUREADY_FIXTURES)")
    return FIXTURES
