#!/usr/bin/env python3
"""A GPU job on a lab host (gpuready lab simulator), started by the lab's gpu-busy fault.

It opens the simulated device node ``$GPUREADY_LAB_RUN/dev/nvidia<N>`` of each GPU index given
on the command line and holds it open until it is stopped, the way a CUDA process holds
/dev/nvidia<N>; the simulated nvidia-smi then lists it in ``--query-compute-apps``. It does
nothing else (no load, no files besides the device stand-ins and a ready marker).

    gpu_job.py 0 [1 ...]
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    indices = [int(a) for a in argv] or [0]
    dev = Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab")) / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    held = []
    for index in indices:
        node = dev / f"nvidia{index}"
        node.touch(exist_ok=True)
        held.append(node.open("rb"))
    ready = dev.parent / "gpu-job.ready"
    ready.write_text(f"{os.getpid()}\n")

    def stop(*_: object) -> None:
        ready.unlink(missing_ok=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
