"""The scale harness's plan (who fails how) and how it reads the validators' exec requests."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from lab.errors import LabError
from lab.scale import plan
from lab.scale.answers import Host, parse_command, pinned_driver
from validate.transport.ssh import remote_command

POOLS = {"pool_h100_sxm": "h100-sxm5-8x", "pool_l40s_pcie": "l40s-pcie-4x"}


def test_two_percent_of_1000_fail_in_each_way_and_carry_each_fault() -> None:
    endpoints = plan.plan(1000, POOLS, failure_rate=0.02, fault_rate=0.01)
    assert Counter(e.failure for e in endpoints) == {
        "": 1000 - 80, "refuse": 20, "stall": 20, "slow": 20, "drop": 20}
    faults = Counter(f for e in endpoints for f in e.faults)
    assert faults == dict.fromkeys(plan.GPU_FAULTS, 10)
    # No endpoint both fails and carries a fault; slow ones are slow.
    assert not [e for e in endpoints if e.failure and e.faults]
    assert {e.latency_s for e in endpoints if e.failure == "slow"} == {2.0}
    # Unique names and address:port pairs, 100 per address, pools in turn.
    assert len({e.name for e in endpoints}) == 1000
    assert len({(e.address, e.port) for e in endpoints}) == 1000
    assert len({e.address for e in endpoints}) == 10
    assert [e.pool for e in endpoints[:3]] == ["pool_h100_sxm", "pool_l40s_pcie", "pool_h100_sxm"]
    assert plan.plan(1000, POOLS, 0.02, 0.01) == endpoints  # deterministic


def test_small_fleets_still_get_one_of_each_failure() -> None:
    endpoints = plan.plan(50, POOLS, failure_rate=0.02)
    assert Counter(e.failure for e in endpoints if e.failure) == dict.fromkeys(plan.FAILURES, 1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"endpoints": 0}, "--endpoints must be 1.."),
    ({"endpoints": 10, "failure_rate": 0.5}, "--failure-rate must be between 0 and 0.1"),
    ({"endpoints": 5, "failure_rate": 0.01, "fault_rate": 0.01}, "5 endpoints cannot carry 9"),
])
def test_bad_plans_are_refused_with_the_reason(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(LabError, match=message):
        plan.plan(pools=POOLS, **kwargs)  # type: ignore[arg-type]


def test_reads_the_validators_exec_request_and_a_plain_command_line() -> None:
    argv = ("journalctl", "--since", "-24h", "SYSLOG_IDENTIFIER=kernel")
    got = parse_command(remote_command(argv, 30))
    assert got.argv == argv and got.timeout_s == 30
    plain = parse_command("nvidia-smi -q -x")
    assert plain.argv == ("nvidia-smi", "-q", "-x") and plain.timeout_s is None


def test_answers_are_the_simulators_for_the_endpoints_hardware_and_faults() -> None:
    healthy, other = plan.plan(2, {"pool_h100_sxm": "h100-sxm5-8x"})
    missing = replace(other, faults=("gpu-missing",))
    driver = pinned_driver()
    good = Host(healthy, driver).answer(("nvidia-smi", "-q", "-x"))
    assert good.rc == 0 and good.stdout.count("<gpu id=") == 8
    assert f"<driver_version>{driver}</driver_version>" in good.stdout
    assert "<persistence_mode>Enabled</persistence_mode>" in good.stdout
    assert Host(missing, driver).answer(("nvidia-smi", "-q", "-x")).stdout.count("<gpu id=") == 7
    assert Host(healthy, driver).answer(("fio", "--version")).rc == 127
