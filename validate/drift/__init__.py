"""Drift: one read-only pass that says, per node, what differs from what the inventory
declares (configuration, versions, runtime, labels and taints, performance against the node's
own history). ``python -m validate drift``; see :mod:`validate.drift.run`."""

from __future__ import annotations

from validate.drift.model import Finding, FindingStatus, Layer
from validate.drift.run import DriftOptions, DriftResult, run_drift

__all__ = ["DriftOptions", "DriftResult", "Finding", "FindingStatus", "Layer", "run_drift"]
