"""dcgm.exporter against REAL dcgm-exporter scrapes served over HTTP, and against peers that
really misbehave (refuse, stall, trickle, answer HTTP 500 or garbage): every way is a row with
its code, within the timeout."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.validate.test_checks_runner import ScriptedTransport, _Gone, _node, _out
from validate import desired, runner
from validate.checks import select
from validate.checks.base import ToolFailure
from validate.checks.dcgm_exporter import (
    CODE_BAD_OUTPUT,
    CODE_COUNT,
    CODE_DOWN,
    CODE_DRIVER,
    CODE_ECC,
    CODE_UUID,
    CODE_XID,
    exporter_url,
    judge,
    scrape,
)
from validate.checks.gpu import NVSMI_XML
from validate.model import Status
from validate.parsers import dcgm_exporter

T4 = "dcgm-exporter/tesla-t4-1gpu-drv460.106.00-exporter2-datadog.prom"
T4_UUID = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
# This machine's test range (GPUREADY_TEST_NET): other tests' servers are elsewhere.
ADDRESS = os.environ.get("GPUREADY_TEST_NET", "127.0.22") + ".132"

Serve = Callable[[socket.socket], None]


@pytest.fixture
def peer() -> Iterator[Callable[[Serve], str]]:
    """A real TCP peer on ADDRESS doing ``serve`` with each connection; yields its URL."""
    socks: list[socket.socket] = []
    stop = threading.Event()

    def start(serve: Serve) -> str:
        listener = socket.socket()
        listener.bind((ADDRESS, 0))
        listener.listen(8)
        listener.settimeout(0.2)
        socks.append(listener)

        def loop() -> None:
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except (TimeoutError, OSError):
                    continue
                socks.append(conn)
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return f"http://{ADDRESS}:{listener.getsockname()[1]}/metrics"

    yield start
    stop.set()
    for s in socks:
        s.close()


def _answer(body: bytes, status: str = "200 OK") -> Serve:
    def serve(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: "
                     f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        conn.close()
    return serve


def _stall(conn: socket.socket) -> None:
    conn.recv(65536)
    time.sleep(30)  # never answers; the test closes the socket


def _trickle(conn: socket.socket) -> None:
    conn.recv(65536)
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        while True:
            conn.sendall(b"#")
            time.sleep(0.05)
    except OSError:
        pass


def _failure(url: str, timeout: float = 1.0) -> tuple[ToolFailure, float]:
    started = time.monotonic()
    with pytest.raises(ToolFailure) as info:
        scrape(url, timeout)
    return info.value, time.monotonic() - started


def test_a_refused_connection_is_down() -> None:
    s = socket.socket()
    s.bind((ADDRESS, 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    failure, _ = _failure(f"http://{ADDRESS}:{port}/metrics")
    assert (failure.code, failure.status) == (CODE_DOWN, Status.FAIL)
    assert "does not answer" in failure.detail and "refused" in failure.detail


@pytest.mark.parametrize("serve", [_stall, _trickle], ids=["stall", "trickle"])
def test_a_peer_that_stalls_or_trickles_is_cut_off(peer, serve: Serve) -> None:
    failure, took = _failure(peer(serve), timeout=1.0)
    assert (failure.code, failure.status) == (CODE_DOWN, Status.FAIL)
    assert "within 1 s" in failure.detail
    assert took < 1.5 + 0.5


def test_an_http_error_is_down(peer) -> None:
    failure, _ = _failure(peer(_answer(b"oops", "500 Internal Server Error")))
    assert failure.code == CODE_DOWN
    assert "HTTP 500 Internal Server Error" in failure.detail


def test_garbage_is_bad_output_naming_the_line(peer) -> None:
    url = peer(_answer(b"<html>\n<body>Grafana</body>\n</html>\n"))
    t = ScriptedTransport("n1", {})
    node = _node(dcgm_exporter_url=url)
    [row] = runner.run_node(node, select("dcgm.exporter"), "r1", t)
    assert (row.status, row.code) == (Status.FAIL, CODE_BAD_OUTPUT)
    assert url in row.detail and "line 1" in row.detail


def test_a_real_scrape_from_another_machine_disagrees_with_the_node(
        peer, fixtures_dir: Path) -> None:
    # The real T4 scrape served for a node whose nvidia-smi is another real T4 (driver
    # 515.105.01): one GPU each, but not the same GPU nor the same driver.
    url = peer(_answer((fixtures_dir / T4).read_bytes()))
    xml = (fixtures_dir / "nvidia-smi-xml/tesla-t4-drv515-v11.xml").read_text()
    t = ScriptedTransport("n1", {NVSMI_XML: _out(xml)})
    rows = runner.run_node(_node(dcgm_exporter_url=url), select("dcgm.exporter"), "r1", t)
    by = {r.metric: r for r in rows}
    assert (by["scrape"].status, by["gpu_count"].status) == (Status.PASS, Status.PASS)
    assert (by["uuids"].status, by["uuids"].code) == (Status.FAIL, CODE_UUID)
    assert f"only the exporter: {T4_UUID}" in by["uuids"].detail
    assert (by["driver_version"].status, by["driver_version"].code) == (Status.FAIL, CODE_DRIVER)
    assert "460.106.00" in by["driver_version"].detail
    assert "515.105.01" in by["driver_version"].detail
    assert by["error_counters"].status is Status.PASS
    assert "DCGM_FI_DEV_XID_ERRORS" in by["error_counters"].detail


def test_the_real_scrape_agrees_with_its_own_node(fixtures_dir: Path) -> None:
    metrics = dcgm_exporter.parse((fixtures_dir / T4).read_text())
    rows = judge(metrics, "u", 1, [T4_UUID], "460.106.00")
    assert [(r.metric, r.status) for r in rows] == [
        ("scrape", Status.PASS), ("gpu_count", Status.PASS), ("uuids", Status.PASS),
        ("driver_version", Status.PASS), ("error_counters", Status.PASS)]
    count = judge(metrics, "u", 2, [T4_UUID, "GPU-other"], "460.106.00")
    by = {r.metric: r for r in count}
    assert (by["gpu_count"].code, by["uuids"].code) == (CODE_COUNT, CODE_UUID)
    assert "only nvidia-smi: GPU-other" in by["uuids"].detail


def test_xid_and_double_bit_ecc_counters(fixtures_dir: Path) -> None:
    # The real scrape with the GPU's last Xid set to 79 and a double-bit ECC family added in
    # dcgm-exporter's own words (etc/default-counters.csv).
    text = (fixtures_dir / T4).read_text()
    labels = text.splitlines()[2].split("{", 1)[1].split("}", 1)[0]
    text = text.replace(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0",
                        f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 79")
    text += ("# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC "
             f"errors.\n# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n"
             f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{labels}}} 2\n")
    rows = judge(dcgm_exporter.parse(text), "u", 1, [T4_UUID], "460.106.00")
    by = {r.metric: r for r in rows}
    assert (by["gpu0/xid"].status, by["gpu0/xid"].code, by["gpu0/xid"].value) == (
        Status.WARN, CODE_XID, 79.0)
    assert (by["gpu0/ecc_dbe"].status, by["gpu0/ecc_dbe"].code, by["gpu0/ecc_dbe"].value) == (
        Status.FAIL, CODE_ECC, 2.0)
    assert "error_counters" not in by


def test_no_exporter_declared_is_a_skip_row() -> None:
    t = ScriptedTransport("n1", {})
    [row] = runner.run_node(_node(), select("dcgm.exporter"), "r1", t)
    assert (row.status, row.code) == (Status.SKIP, "ok")
    assert "dcgm_exporter_port" in row.detail
    assert t.calls == []


def test_the_url_from_the_inventory() -> None:
    assert exporter_url({}, "10.0.0.5") is None
    assert exporter_url({"dcgm_exporter_port": 9400}, "10.0.0.5") == \
        "http://10.0.0.5:9400/metrics"
    assert exporter_url({"dcgm_exporter_port": "9400"}, "fd00::5") == \
        "http://[fd00::5]:9400/metrics"
    assert exporter_url({"dcgm_exporter_url": "http://svc:9400/metrics",
                         "dcgm_exporter_port": 1}, "x") == "http://svc:9400/metrics"
    with pytest.raises(ToolFailure, match="dcgm_exporter_port 'nine' is not a port number"):
        exporter_url({"dcgm_exporter_port": "nine"}, "x")


def test_the_inventory_refuses_a_bad_port_or_url() -> None:
    _, problems = desired.read({"dcgm_exporter_port": 70000, "dcgm_exporter_url": "ftp://x"})
    assert [(p.var, p.reason) for p in problems] == [
        ("dcgm_exporter_port", "is 70000, not a TCP port (1 to 65535)"),
        ("dcgm_exporter_url", "is 'ftp://x', not an http:// or https:// URL")]
    _, problems = desired.read({"dcgm_exporter_port": 9400})
    assert problems == ()


def test_an_unreachable_node_is_that_row_whatever_its_exporter_serves() -> None:
    # The exporter port is refused; the node does not answer SSH either (gpu.count found out
    # first): the row says unreachable, as every other check's does.
    s = socket.socket()
    s.bind((ADDRESS, 0))
    port = s.getsockname()[1]
    s.close()
    node = _node(dcgm_exporter_url=f"http://{ADDRESS}:{port}/metrics")
    rows = runner.run_node(node, select("gpu.count,dcgm.exporter"), "r1", _Gone("n1", {}))
    assert [(r.check, r.code) for r in rows] == [("gpu.count", "host.unreachable"),
                                                 ("dcgm.exporter", "host.unreachable")]
