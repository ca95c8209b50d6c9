"""node.services: the systemd units a GPU node needs are active.

containerd and kubelet always; nvidia-persistenced on every GPU node; nvidia-fabricmanager
where the profile has NVSwitch; the inventory var ``gpuready_services`` (a list of unit names)
replaces that set. One ``systemctl is-active`` call (it exits 3 when any unit is
not active, so the exit status is not an error here). Row ``inactive_units``; code
``node.services.inactive``.
"""

from __future__ import annotations

from validate.checks.base import Check, NodeContext, ToolFailure, Verdict
from validate.model import CODE_PARSE, Status


def expected_units(nvswitch: bool) -> tuple[str, ...]:
    """Units that must be active on a node of a profile with/without NVSwitch."""
    units = ("containerd.service", "kubelet.service", "nvidia-persistenced.service")
    return (*units, "nvidia-fabricmanager.service") if nvswitch else units


class NodeServices(Check):
    id = "node.services"
    title = "Required services active"
    order = 3

    def evaluate(self, ctx: NodeContext) -> list[Verdict]:
        override = ctx.node.vars.get("gpuready_services")
        if override is not None and not (
            isinstance(override, list) and all(isinstance(u, str) for u in override)
        ):
            raise ToolFailure("inventory.invalid", "gpuready_services must be a list of units")
        units = tuple(override) if override else expected_units(ctx.profile.hardware.nvswitch)
        result = ctx.output(("systemctl", "is-active", *units), ok_rcs=(0, 3, 4))
        return judge_services(units, result.stdout)


def judge_services(units: tuple[str, ...], stdout: str) -> list[Verdict]:
    """``systemctl is-active`` prints one state per unit, in order."""
    states = stdout.split()
    if len(states) != len(units):
        raise ToolFailure(
            CODE_PARSE,
            f"systemctl is-active: {len(states)} states for "
            f"{len(units)} units: {stdout.strip()[:200]}",
        )
    bad = [f"{u}={s}" for u, s in zip(units, states, strict=True) if s != "active"]
    return [
        Verdict(
            "inactive_units",
            Status.FAIL if bad else Status.PASS,
            "node.services.inactive" if bad else "ok",
            ", ".join(bad),
            float(len(bad)),
            "units",
        )
    ]


CHECKS: tuple[Check, ...] = (NodeServices(),)
