"""What common NVIDIA Xid codes mean and what an operator should do about them.

Sources (NVIDIA's public documentation):

* "Analyzing Xid Errors with the Xid Catalog",
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (Ampere and newer:
  mnemonic, description, immediate and investigatory "resolution buckets" such as
  ``RESTART_APP``, ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT``, ``IGNORE``).
* "Dynamic Page Retirement - Visibility",
  https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html (Xid 48/63/64).

``severity`` is our policy for a node being validated, derived from those buckets:
``critical`` when the GPU or node must be reset, drained or serviced before it takes work
(``RESET_GPU``, ``RESTART_BM``, hardware investigation); ``warning`` when the event points at the
GPU but the immediate fix is restarting the application or a reset at the next convenient time;
``info`` when the event is usually the application's own fault or a consequence of another event.
The ``action`` text starts with the catalog's immediate-action bucket.

Schema: ``XID_CATALOG: dict[int, XidInfo(severity, summary, action)]``; :func:`lookup` returns
an entry for any code (unknown codes are a ``warning`` pointing at the catalog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class XidInfo:
    """Meaning of one Xid code and the recommended response."""

    severity: Severity
    summary: str
    action: str


XID_CATALOG: dict[int, XidInfo] = {
    8: XidInfo(
        "warning",
        "GPU stopped processing (channel idle timeout)",
        "RESTART_APP; if it repeats on the same GPU, run diagnostics (dcgmi diag)",
    ),
    13: XidInfo(
        "info",
        "Graphics engine exception (usually an application fault, e.g. out-of-range address)",
        "RESTART_APP; debug the application; if several applications hit it on the same GPU, "
        "run diagnostics",
    ),
    31: XidInfo(
        "info",
        "GPU memory page fault (MMU fault; usually an illegal address in the application)",
        "RESTART_APP; debug the application; repeated faults on one GPU across applications "
        "warrant diagnostics",
    ),
    43: XidInfo(
        "info",
        "GPU stopped processing: the channel was reset after a fault in the user application",
        "IGNORE for the node: the faulting application must be restarted",
    ),
    45: XidInfo(
        "info",
        "Preemptive cleanup after earlier errors or because the application was killed",
        "IGNORE; look at the Xid events that preceded it",
    ),
    48: XidInfo(
        "critical",
        "Double-bit (uncorrectable) ECC error in GPU memory",
        "RESET_GPU (drain the node first); on Ampere+ check for Xid 63/64/94/95 and the row "
        "remapping state; replace the GPU if it repeats",
    ),
    61: XidInfo(
        "critical",
        "Internal micro-controller breakpoint/warning",
        "RESET_GPU; CONTACT_SUPPORT if it repeats",
    ),
    62: XidInfo(
        "critical",
        "Internal micro-controller halt",
        "RESET_GPU; CONTACT_SUPPORT if it repeats",
    ),
    63: XidInfo(
        "warning",
        "ECC page retirement or row remapping recorded (memory cells being mapped out)",
        "RESET_GPU when convenient so the remapping takes effect; watch remapped-row counts",
    ),
    64: XidInfo(
        "critical",
        "ECC page retirement or row remapping failed (no spare rows / recording failure)",
        "RESET_GPU and run field diagnostics; the GPU likely needs replacement",
    ),
    68: XidInfo(
        "warning",
        "Video processor (NVDEC) exception",
        "RESTART_APP; run diagnostics if it repeats",
    ),
    69: XidInfo(
        "warning",
        "Graphics engine class error",
        "RESTART_APP; run diagnostics if it repeats",
    ),
    74: XidInfo(
        "critical",
        "NVLink error (link fault between GPUs or to the NVSwitch)",
        "RESET_GPU; check NVLink state and counters (nvidia-smi nvlink -s/-e) and the fabric "
        "manager; reseat or replace if it persists",
    ),
    79: XidInfo(
        "critical",
        "GPU has fallen off the bus (no longer reachable over PCIe)",
        "RESTART_BM (reboot the node); investigate PCIe link, power and thermals; replace "
        "hardware if it recurs",
    ),
    92: XidInfo(
        "warning",
        "High single-bit (correctable) ECC error rate",
        "Monitor; RESET_GPU at the next maintenance window; replace the GPU if the rate stays high",
    ),
    94: XidInfo(
        "warning",
        "Contained ECC error: only the affected application was stopped",
        "RESTART_APP; RESET_GPU when convenient so the faulty row is remapped",
    ),
    95: XidInfo(
        "critical",
        "Uncontained ECC error: every application on the GPU may be affected",
        "RESET_GPU (drain the node first); replace the GPU if it repeats",
    ),
    119: XidInfo(
        "critical",
        "GSP RPC timeout (the GPU System Processor did not answer the driver)",
        "RESET_GPU (or reboot the node); CONTACT_SUPPORT if it repeats",
    ),
    120: XidInfo(
        "critical",
        "GSP error (the GPU System Processor reported a fault)",
        "RESET_GPU (or reboot the node); CONTACT_SUPPORT if it repeats",
    ),
    140: XidInfo(
        "critical",
        "Unrecovered ECC error",
        "RESET_GPU (drain the node first); replace the GPU if it repeats",
    ),
    154: XidInfo(
        "critical",
        "GPU recovery action changed (the driver says a GPU reset or node reboot is required)",
        "Follow the action in the message (GPU reset, drain and reset, or node reboot)",
    ),
}


def lookup(code: int) -> XidInfo:
    """The catalog entry for ``code``; unknown codes are a warning that points at NVIDIA's list."""
    known = XID_CATALOG.get(code)
    if known is not None:
        return known
    return XidInfo("warning", f"Xid {code} (not in our catalog)", f"See {CATALOG_URL}")
