"""dcgm.exporter: the node's DCGM exporter answers, and its GPUs are the node's GPUs.

Prometheus learns a node's GPU health from NVIDIA's dcgm-exporter. An exporter that is down,
or that serves another node's (or a stale) view, hides XIDs and ECC errors from monitoring
while every nvidia-smi check passes. This check scrapes the exporter the way Prometheus does
(an HTTP GET of ``/metrics``, from the machine that runs the validators, no proxy) and compares
it with what ``nvidia-smi -q -x`` said on the node in the same run:

- ``scrape``: the exporter answered with DCGM metrics (``dcgm.exporter.down`` when it refuses
  the connection, stalls past ``thresholds.dcgm.exporter_timeout_s`` (default 10 s; cut off
  within 1.5 times that at worst) or answers an HTTP error; ``dcgm.exporter.bad_output`` when
  what it serves is not DCGM's Prometheus text);
- ``gpu_count``: as many GPUs as nvidia-smi lists (``dcgm.exporter.gpu_count_mismatch``);
- ``uuids``: the same GPU UUIDs (``dcgm.exporter.uuid_mismatch``, naming those only one side
  has);
- ``driver_version``: the ``DCGM_FI_DRIVER_VERSION`` label equals nvidia-smi's driver
  (``dcgm.exporter.driver_mismatch``); a skip row when the exporter does not label it;
- ``gpu<i>/xid``: ``DCGM_FI_DEV_XID_ERRORS`` (the last Xid the GPU raised) when not 0, a warn
  (``dcgm.exporter.xid``: gpu.xid reads the kernel log for the full story);
  ``gpu<i>/ecc_dbe``: double-bit ECC errors (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``,
  ``..._AGG_TOTAL``) above 0, a fail (``dcgm.exporter.ecc``); otherwise one ``error_counters``
  pass row saying which of these fields the exporter serves.

Where the exporter is: the inventory's ``dcgm_exporter_port`` on the node (dcgm-exporter listens
on 9400 by default; the URL is ``http://<ansible_host>:<port>/metrics``) or
``dcgm_exporter_url`` (a full URL, for an exporter behind a Service or on another address).
A node whose inventory declares neither gets a skip row saying so, as dcgm.diag does on a node
without DCGM. The inventory loader refuses a port that is not 1 to 65535 and a URL that is not
http(s) (validate.desired).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from validate import desired
from validate.checks.base import Check, NodeContext, ToolFailure, Verdict, expect_equal
from validate.checks.gpu import smi_log
from validate.model import Status
from validate.parsers import ParseError, dcgm_exporter

CHECK_ID = "dcgm.exporter"
CODE_DOWN = "dcgm.exporter.down"
CODE_BAD_OUTPUT = "dcgm.exporter.bad_output"
CODE_COUNT = "dcgm.exporter.gpu_count_mismatch"
CODE_UUID = "dcgm.exporter.uuid_mismatch"
CODE_DRIVER = "dcgm.exporter.driver_mismatch"
CODE_XID = "dcgm.exporter.xid"
CODE_ECC = "dcgm.exporter.ecc"
CODES = (CODE_DOWN, CODE_BAD_OUTPUT, CODE_COUNT, CODE_UUID, CODE_DRIVER, CODE_XID, CODE_ECC)

PORT_VAR = desired.DCGM_EXPORTER_PORT
URL_VAR = desired.DCGM_EXPORTER_URL
DEFAULT_TIMEOUT_S = 10.0
# More than any real scrape (an 8-GPU node with every field is a few hundred KiB).
MAX_BYTES = 16 * 1024 * 1024
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
DBE_FIELDS = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")
SBE_FIELDS = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")


def exporter_url(vars_: Mapping[str, Any], address: str) -> str | None:
    """The node's exporter URL from its inventory variables, or None when none is declared."""
    url = vars_.get(URL_VAR)
    if url:
        return str(url)
    port = vars_.get(PORT_VAR)
    if port is None or port == "":
        return None
    try:
        number = int(str(port))
    except ValueError:
        raise ToolFailure("inventory.invalid", f"{PORT_VAR} {port!r} is not a port number") \
            from None
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{number}/metrics"


def scrape(url: str, timeout_s: float) -> str:
    """GET ``url`` within ``timeout_s`` in all (a peer that trickles bytes is cut off too);
    a ToolFailure (status fail, ``dcgm.exporter.down``) naming why when it gives no page."""
    deadline = time.monotonic() + timeout_s
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    chunks: list[bytes] = []
    try:
        # Each socket wait is at most half the budget, and the whole answer must be in by the
        # deadline: a peer that stalls or trickles is cut off within 1.5x the timeout at worst.
        with opener.open(request, timeout=timeout_s / 2) as response:
            size = 0
            while chunk := response.read1(65536):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise ToolFailure(CODE_BAD_OUTPUT, f"{url} served more than "
                                                       f"{MAX_BYTES // 2**20} MiB", Status.FAIL)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError
    except urllib.error.HTTPError as exc:
        raise ToolFailure(CODE_DOWN, f"{url} answered HTTP {exc.code} {exc.reason}",
                          Status.FAIL) from None
    except TimeoutError:
        raise ToolFailure(CODE_DOWN, f"{url} gave no complete answer within {timeout_s:g} s",
                          Status.FAIL) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise ToolFailure(CODE_DOWN, f"{url} gave no answer within {timeout_s:g} s",
                              Status.FAIL) from None
        raise ToolFailure(CODE_DOWN, f"{url} does not answer: {reason}", Status.FAIL) from None
    except (OSError, ValueError) as exc:  # reset mid-answer, a bad status line
        raise ToolFailure(CODE_DOWN, f"{url}: the answer broke off: "
                                     f"{type(exc).__name__}: {exc}", Status.FAIL) from None
    return b"".join(chunks).decode("utf-8", errors="replace")


class DcgmExporter(Check):
    id = CHECK_ID
    title = "DCGM exporter answers and agrees with nvidia-smi"
    order = 59

    def skip_reason(self, ctx: NodeContext) -> str | None:
        if exporter_url(ctx.node.vars, ctx.node.address) is None:
            return (f"no DCGM exporter declared for the node: the inventory sets no {PORT_VAR} "
                    f"or {URL_VAR}")
        return None

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        url = exporter_url(ctx.node.vars, ctx.node.address)
        assert url is not None  # skip_reason said so
        if ctx.gone_error is not None:  # an unreachable node is that row, whatever serves
            raise ctx.gone_error
        timeout = ctx.profile.value("dcgm.exporter_timeout_s", float, DEFAULT_TIMEOUT_S)
        text = scrape(url, timeout)
        try:
            metrics = dcgm_exporter.parse(text)
        except ParseError as exc:
            raise ToolFailure(CODE_BAD_OUTPUT, f"{url}: {exc.reason}", Status.FAIL) from None
        log = smi_log(ctx)
        smi_uuids = [g.uuid for g in log.gpus if g.uuid]
        return judge(metrics, url, len(log.gpus), smi_uuids, log.driver_version)


def judge(metrics: dcgm_exporter.ExporterScrape, url: str, smi_count: int,
          smi_uuids: list[str], smi_driver: str | None) -> list[Verdict]:
    """The exporter's view against nvidia-smi's (see the module docstring for the rows)."""
    gpus = metrics.gpus
    hosts = sorted({g.hostname for g in gpus if g.hostname})
    rows = [Verdict("scrape", Status.PASS, "ok",
                    f"{url}: {len(gpus)} GPUs" + (f", Hostname {', '.join(hosts)}" if hosts
                                                  else ""))]
    rows.append(expect_equal("gpu_count", len(gpus), smi_count, CODE_COUNT,
                             "" if len(gpus) == smi_count else
                             f"the exporter reports {len(gpus)} GPUs, nvidia-smi lists "
                             f"{smi_count}"))
    ours = {g.uuid for g in gpus}
    theirs = set(smi_uuids)
    if ours == theirs:
        rows.append(Verdict("uuids", Status.PASS, "ok", f"{len(ours)} UUIDs as nvidia-smi"))
    else:
        parts = []
        if ours - theirs:
            parts.append(f"only the exporter: {', '.join(sorted(ours - theirs))}")
        if theirs - ours:
            parts.append(f"only nvidia-smi: {', '.join(sorted(theirs - ours))}")
        rows.append(Verdict("uuids", Status.FAIL, CODE_UUID,
                            "GPU UUIDs differ (" + "; ".join(parts) + ")"))
    versions = metrics.driver_versions
    if not versions:
        rows.append(Verdict("driver_version", Status.SKIP, "ok",
                            "the exporter labels no DCGM_FI_DRIVER_VERSION"))
    elif smi_driver is None:
        rows.append(Verdict("driver_version", Status.SKIP, "ok",
                            "nvidia-smi gave no driver version to compare with"))
    elif versions == {smi_driver}:
        rows.append(Verdict("driver_version", Status.PASS, "ok", f"driver {smi_driver}"))
    else:
        rows.append(Verdict("driver_version", Status.FAIL, CODE_DRIVER,
                            f"the exporter reports driver {', '.join(sorted(versions))}, "
                            f"nvidia-smi {smi_driver}"))
    counters = []
    served: set[str] = set()
    for gpu in gpus:
        served |= {f for f in (XID_FIELD, *DBE_FIELDS, *SBE_FIELDS) if f in gpu.values}
        xid = gpu.values.get(XID_FIELD)
        if xid:
            counters.append(Verdict(
                f"gpu{gpu.index}/xid", Status.WARN, CODE_XID,
                f"GPU {gpu.index} ({gpu.uuid}): the last Xid DCGM saw is {xid:g} "
                f"(see gpu.xid for the kernel log)", xid))
        dbe = max((gpu.values[f] for f in DBE_FIELDS if f in gpu.values), default=0.0)
        if dbe > 0:
            counters.append(Verdict(
                f"gpu{gpu.index}/ecc_dbe", Status.FAIL, CODE_ECC,
                f"GPU {gpu.index} ({gpu.uuid}): {dbe:g} double-bit ECC errors", dbe, "count"))
    if counters:
        rows.extend(counters)
    else:
        fields = ", ".join(sorted(served)) or "no Xid or ECC field"
        rows.append(Verdict("error_counters", Status.PASS, "ok",
                            f"none raised ({fields} served)"))
    return rows


CHECKS: tuple[Check, ...] = (DcgmExporter(),)
