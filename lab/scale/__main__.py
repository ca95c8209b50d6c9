"""``python -m lab.scale serve --endpoints N``: serve the scale harness until SIGTERM/SIGINT.

Prints one line when every endpoint listens (``scale harness: ready ...``); writes
``<dir>/inventory/`` (drive the validators with ``-i <dir>/inventory``), ``<dir>/known_hosts``,
``<dir>/id_ed25519`` and ``<dir>/plan.json`` (each endpoint's faults and failure mode).
Errors are one line, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from pathlib import Path

from lab import fleet as fleet_mod
from lab.errors import LabError
from lab.paths import LabPaths
from lab.scale import answers, inventory, plan, server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab.scale",
        description="gpuready SCALE HARNESS (simulated): many SSH endpoints from one process.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the endpoints until SIGTERM/SIGINT")
    serve.add_argument("--endpoints", type=int, required=True)
    serve.add_argument("--fleet", default="default",
                       help="lab fleet whose pools the endpoints are spread over")
    serve.add_argument("--failure-rate", type=float, default=0.0,
                       help=f"share failing in each way ({', '.join(plan.FAILURES)})")
    serve.add_argument("--fault-rate", type=float, default=0.0,
                       help=f"share with each lab fault ({', '.join(plan.GPU_FAULTS)})")
    serve.add_argument("--latency-ms", type=float, default=0.0,
                       help="delay before every answer")
    serve.add_argument("--slow-s", type=float, default=2.0,
                       help="delay before every answer of a 'slow' endpoint")
    serve.add_argument("--dir", type=Path, default=None,
                       help="where to write inventory, keys and plan (default .lab/scale)")
    return parser


def _pools(fleet: str) -> dict[str, str]:
    """The fleet's pools and their hardware profiles, in the fleet's order (checked as
    `lab up` checks them)."""
    pools: dict[str, str] = {}
    for host in fleet_mod.load_fleet(fleet, nodes=fleet_mod.MAX_HOSTS):
        pools.setdefault(host.pool, host.hw_profile)
    return pools


async def _serve(args: argparse.Namespace, directory: Path) -> None:
    started = time.monotonic()
    endpoints = plan.plan(args.endpoints, _pools(args.fleet), args.failure_rate,
                          args.fault_rate, args.latency_ms / 1000, args.slow_s)
    driver = answers.pinned_driver()
    hosts = {e.name: answers.Host(e, driver) for e in endpoints}
    for host in hosts.values():  # render the gpu.* answers now, not during a timed run
        for argv in (("nvidia-smi", "-q", "-x"), ("nvidia-smi", "topo", "-m"),
                     ("nvidia-smi", "nvlink", "-s")):
            host.answer(argv)
    key = server.client_key(directory)
    try:
        listening = await server.listen(endpoints, hosts, key)
    except OSError as exc:
        raise LabError(f"cannot listen: {exc.strerror or exc} (another harness on "
                       f"{fleet_mod.ADDRESS_NET}? set GPUREADY_LAB_NET)") from None
    known = directory / "known_hosts"
    known.write_text(listening.known_hosts)
    inv = inventory.write(directory, endpoints, directory / "id_ed25519", known)
    failing = sum(1 for e in endpoints if e.failure)
    print(f"scale harness: ready, {len(endpoints)} SIMULATED endpoints ({failing} failing) on "
          f"{fleet_mod.ADDRESS_NET} in {time.monotonic() - started:.1f} s; inventory: {inv}",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close(listening)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Clients that go away mid-answer (a killed ssh, a validator's timeout) are what the
    # harness is for: asyncio's "socket.send() raised exception." for each is noise.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    directory = (args.dir or LabPaths.default().root / "scale").resolve()
    try:
        asyncio.run(_serve(args, directory))
    except LabError as exc:
        print(f"scale harness: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
