"""The SIMULATED dcgm-exporter in every lab host with GPUs (lab/sim/dcgm_exporter.py).

A GPU node of a real site runs NVIDIA's dcgm-exporter (the GPU Operator's DaemonSet, or the
container on its own), which Prometheus scrapes on port 9400; the validators' ``dcgm.exporter``
check scrapes it too and compares it with nvidia-smi. The lab gives each host with simulated
GPUs one unit, ``gpuready-lab-dcgm-exporter.service``, enabled at boot, that serves the host's
simulated hardware on ``<host address>:9400`` (the lab's hosts share this machine's network
namespace, each on its own loopback address; the simulator finds its own from /etc/hosts, so a
cloned disk serves its new host). The lab inventory declares it (``dcgm_exporter_port``).
"""

from __future__ import annotations

from pathlib import Path

UNIT_NAME = "gpuready-lab-dcgm-exporter.service"
PORT = 9400
UNIT = f"""\
[Unit]
Description=NVIDIA dcgm-exporter (SIMULATED by the gpuready lab, from the simulated hardware)
After=network.target

[Service]
Environment=GPUREADY_SIM_PORT={PORT}
ExecStart=/usr/bin/python3 /opt/gpuready-lab/sim/dcgm_exporter.py
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def provision(root: Path) -> None:
    """Install and enable the unit in a host's (not yet booted) overlay."""
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / UNIT_NAME).write_text(UNIT)
    wants = units / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    link = wants / UNIT_NAME
    if not link.is_symlink():
        link.symlink_to(f"/etc/systemd/system/{UNIT_NAME}")
