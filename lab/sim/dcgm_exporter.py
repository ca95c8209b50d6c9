#!/usr/bin/env python3
"""gpuready lab simulator: a SIMULATED NVIDIA dcgm-exporter (Prometheus ``/metrics``).

Runs in each lab host with GPUs, under ``gpuready-lab-dcgm-exporter.service`` (lab/exporter.py),
and serves ``GET /metrics`` on the host's own address (its hostname's in /etc/hosts; the lab's
hosts share this machine's network namespace, each on its own loopback address), port env
GPUREADY_SIM_PORT (default 9400); env GPUREADY_SIM_LISTEN (``address:port``) overrides both.

The page is rendered at each scrape from the host's simulated hardware
($GPUREADY_LAB_HW/hardware.json, faults.json) in the exact shape of a real dcgm-exporter 2.x
scrape (tests/fixtures/dcgm-exporter/tesla-t4-1gpu-drv460.106.00-exporter2-datadog.prom; held to
it by tests/unit/lab/test_sim_dcgm_exporter.py): the same 16 ``DCGM_FI_DEV_*`` families in the
same order with the same HELP and TYPE lines, one sample per GPU labelled ``gpu``, ``UUID``,
``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, ``DCGM_FI_PROCESS_NAME``.
Its first line is a comment saying it is SIMULATED (Prometheus parsers skip comments).

As NVML shows the node: the loaded driver ($GPUREADY_LAB_RUN/nvidia-module-version) is the
driver label; gpu-missing drops the last GPU; xid-79 sets the last GPU's
``DCGM_FI_DEV_XID_ERRORS`` to 79, xid-48 GPU 0's to 48. Without a loaded driver (none installed,
or driver-not-loaded) the real exporter cannot start DCGM and exits: this one does not listen.
Lab faults of its own: ``dcgm-exporter-down`` (not listening: connections are refused) and
``dcgm-exporter-stale`` (the last GPU is reported with the UUID of the board it replaced). The
faults are read every half second: setting or clearing one takes effect without a restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

SIMULATOR = "gpuready lab simulator"
BANNER = (f"# {SIMULATOR}: SIMULATED dcgm-exporter, rendered from this lab host's simulated "
          "hardware (no GPU, no DCGM)")
PROCESS_NAME = "/usr/bin/dcgm-exporter"
POLL_S = 0.5

# (field, HELP, TYPE) in the order of the real capture.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).",
     "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
     "Total number of NVLink bandwidth counters for all lanes", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU License status", "gauge"),
    ("DCGM_FI_DEV_COUNT", "Number of Devices on the node.", "counter"),
)


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def load() -> tuple[dict[str, Any], set[str], str | None]:
    """The host's hardware, its faults and the loaded driver's version (None: none loaded)."""
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults: set[str] = set()
    faults_path = _hw_dir() / "faults.json"
    if faults_path.exists():
        faults = set(json.loads(faults_path.read_text()).get("faults", []))
    module = _run_dir() / "nvidia-module-version"
    driver = module.read_text().strip() if module.exists() else None
    return hw, faults, driver or None


def stale_uuid(hostname: str) -> str:
    """The UUID of the board the last GPU replaced (dcgm-exporter-stale): stable per host."""
    h = hashlib.sha256(f"{hostname}:replaced-board".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def listening(faults: set[str], driver: str | None) -> bool:
    return driver is not None and not {"dcgm-exporter-down", "driver-not-loaded"} & faults


def render(hw: dict[str, Any], faults: set[str], driver: str, uptime_s: float = 0.0) -> str:
    """The page a real dcgm-exporter would serve for this node (see the module docstring)."""
    gpus = list(hw.get("gpus", []))
    if "gpu-missing" in faults and gpus:
        gpus = gpus[:-1]
    hostname = str(hw.get("hostname", ""))
    rows: list[tuple[dict[str, Any], str, dict[str, float]]] = []
    for n, gpu in enumerate(gpus):
        uuid = str(gpu["uuid"])
        if "dcgm-exporter-stale" in faults and n == len(gpus) - 1:
            uuid = stale_uuid(hostname)
        clocks = gpu.get("clocks_idle_mhz", {})
        total = int(gpu.get("memory_total_mib", 0))
        reserved = int(gpu.get("memory_reserved_mib", 0))
        power = float(gpu.get("power_idle_w", 0.0))
        xid = 0
        if "xid-48" in faults and n == 0:
            xid = 48
        if "xid-79" in faults and n == len(hw.get("gpus", [])) - 1:
            xid = 79
        values = {
            "DCGM_FI_DEV_SM_CLOCK": clocks.get("sm", 0),
            "DCGM_FI_DEV_MEM_CLOCK": clocks.get("memory", 0),
            "DCGM_FI_DEV_GPU_TEMP": gpu.get("temp_idle_c", 0),
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(power * uptime_s * 1000),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": 0,
            "DCGM_FI_DEV_MEM_COPY_UTIL": 0,
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": xid,
            "DCGM_FI_DEV_FB_FREE": total - reserved,
            "DCGM_FI_DEV_FB_USED": 0,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_COUNT": len(gpus),
        }
        labels = (f'gpu="{gpu["index"]}",UUID="{uuid}",'
                  f'device="nvidia{gpu.get("minor_number", gpu["index"])}",'
                  f'modelName="{gpu["name"]}",Hostname="{hostname}",'
                  f'DCGM_FI_DRIVER_VERSION="{driver}",DCGM_FI_PROCESS_NAME="{PROCESS_NAME}"')
        rows.append((gpu, labels, values))
    lines = [BANNER]
    for name, help_text, kind in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for _gpu, labels, values in rows:
            value = values[name]
            shown = f"{value:.6f}" if isinstance(value, float) else str(value)
            lines.append(f"{name}{{{labels}}} {shown}")
    return "\n".join(lines) + "\n"


_started = time.monotonic()


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpuready-lab-dcgm-exporter"

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        hw, faults, driver = load()
        body = render(hw, faults, driver or "", time.monotonic() - _started).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(address: str, port: int, stop: threading.Event) -> None:
    """Listen while the node would have a running exporter; close the socket when not."""
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    while not stop.is_set():
        try:
            _hw, faults, driver = load()
            want = listening(faults, driver)
        except (OSError, ValueError):
            want = False
        if want and server is None:
            try:
                server = ThreadingHTTPServer((address, port), _Handler)
            except OSError as exc:
                print(f"{SIMULATOR}: dcgm-exporter cannot listen on {address}:{port}: {exc}",
                      file=sys.stderr, flush=True)
            else:
                thread = threading.Thread(target=server.serve_forever, daemon=True)
                thread.start()
                print(f"{SIMULATOR}: dcgm-exporter listening on {address}:{port}", flush=True)
        elif not want and server is not None:
            server.shutdown()
            server.server_close()
            server = None
            print(f"{SIMULATOR}: dcgm-exporter stopped listening", flush=True)
        stop.wait(POLL_S)
    if server is not None:
        server.shutdown()
        server.server_close()


def main() -> int:
    port_default = os.environ.get("GPUREADY_SIM_PORT", "9400")
    listen = os.environ.get("GPUREADY_SIM_LISTEN") or (
        f"{socket.gethostbyname(socket.gethostname())}:{port_default}")
    address, _, port = listen.rpartition(":")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{SIMULATOR}: SIMULATED dcgm-exporter for {listen}", flush=True)
    serve(address.strip("[]"), int(port), stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
