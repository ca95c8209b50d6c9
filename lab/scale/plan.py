"""Which endpoints the harness serves: name, pool, simulated hardware, lab faults, address and
port, latency and failure mode. Deterministic: the same arguments give the same fleet.

Failure modes (per endpoint, :data:`FAILURES`):

- ``refuse``: nothing listens on its port (TCP connection refused);
- ``stall``: SSH works, every command hangs without output until the remote wrapper's
  ``timeout`` kills it (exit 137, as GNU ``timeout --signal=KILL``); without the wrapper, until
  the client goes away;
- ``slow``: every command answers after ``slow_s`` (correct output, late);
- ``drop``: the first command prints half its output, then the TCP connection is cut (no SSH
  disconnect, no exit status), as a host that crashes mid-command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.errors import LabError
from lab.fleet import ADDRESS_BASE, ADDRESS_NET

FAILURES = ("refuse", "stall", "slow", "drop")
# The lab faults the gpu.* checks see, in the order the harness hands them out.
GPU_FAULTS = ("gpu-missing", "ecc-uncorrectable", "pcie-degraded", "xid-79", "driver-not-loaded")
# Endpoints per address: 10 addresses serve 1,000 endpoints, on ports FIRST_PORT and up.
PER_ADDRESS = 100
FIRST_PORT = 22000
MAX_ENDPOINTS = PER_ADDRESS * (254 - ADDRESS_BASE)


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    pool: str
    hw_profile: str
    address: str
    port: int
    faults: tuple[str, ...] = field(default_factory=tuple)  # lab faults the simulators show
    failure: str = ""  # one of FAILURES, or "" for none
    latency_s: float = 0.0  # before every answer


def _spread(total: int, count: int, offset: int, taken: set[int]) -> list[int]:
    """``count`` indices spread evenly over ``range(total)``, starting near ``offset``, none
    of them in ``taken`` (which they are added to)."""
    picked = []
    for j in range(count):
        index = (offset + j * total // count) % total
        while index in taken:
            index = (index + 1) % total
        taken.add(index)
        picked.append(index)
    return picked


def plan(endpoints: int, pools: dict[str, str], failure_rate: float = 0.0,
         fault_rate: float = 0.0, latency_s: float = 0.0, slow_s: float = 2.0,
         prefix: str = "scale") -> list[Endpoint]:
    """``endpoints`` endpoints over ``pools`` (inventory group -> hardware profile, in turn);
    ``failure_rate`` of them fail in each of :data:`FAILURES` (at least one each when the rate
    is above zero), ``fault_rate`` of the others carry each of :data:`GPU_FAULTS`."""
    if not 1 <= endpoints <= MAX_ENDPOINTS:
        raise LabError(f"--endpoints must be 1..{MAX_ENDPOINTS} (got {endpoints})")
    for what, rate in (("--failure-rate", failure_rate), ("--fault-rate", fault_rate)):
        if not 0.0 <= rate <= 0.1:
            raise LabError(f"{what} must be between 0 and 0.1 (got {rate:g})")
    if latency_s < 0 or slow_s < 0:
        raise LabError("latencies must not be negative")
    if not pools:
        raise LabError("no pools to spread endpoints over")

    def per_kind(rate: float) -> int:
        return max(1, round(endpoints * rate)) if rate > 0 else 0

    need = per_kind(failure_rate) * len(FAILURES) + per_kind(fault_rate) * len(GPU_FAULTS)
    if need > endpoints:
        raise LabError(f"{endpoints} endpoints cannot carry {need} failing ones; use more "
                       "endpoints or lower rates")
    taken: set[int] = set()
    failure_at: dict[int, str] = {}
    for k, kind in enumerate(FAILURES):
        for i in _spread(endpoints, per_kind(failure_rate), 3 + 7 * k, taken):
            failure_at[i] = kind
    fault_at: dict[int, str] = {}
    for k, fault in enumerate(GPU_FAULTS):
        for i in _spread(endpoints, per_kind(fault_rate), 5 + 11 * k, taken):
            fault_at[i] = fault
    names = list(pools)
    width = len(str(endpoints))
    out = []
    for i in range(endpoints):
        pool = names[i % len(names)]
        out.append(Endpoint(
            name=f"{prefix}{i + 1:0{width}d}", pool=pool, hw_profile=pools[pool],
            address=str(ADDRESS_NET[ADDRESS_BASE + 1 + i // PER_ADDRESS]),
            port=FIRST_PORT + i % PER_ADDRESS,
            faults=(fault_at[i],) if i in fault_at else (),
            failure=failure_at.get(i, ""),
            latency_s=slow_s if failure_at.get(i) == "slow" else latency_s))
    return out
