"""node.services: the systemd units a GPU node needs are active.

containerd and kubelet always; nvidia-persistenced on every GPU node; nvidia-fabricmanager
where the profile has NVSwitch; the inventory var ``gpuready_services`` (a list of unit names)
replaces that set. One ``systemctl is-active`` call (it exits 3 when any unit is
not active, so the exit status is not an error here). Row ``inactive_units``; code
``node.services.inactive``.

kubelet before ``kubeadm join`` is not running (a real one crash-loops without its kubeconfig;
bootstrap leaves it enabled and join starts it), and the pipeline validates nodes before they
are let into the cluster. So an inactive kubelet passes while the node has not joined
(``/etc/kubernetes/kubelet.conf`` absent) and the unit is enabled to start; it fails once the
node has joined, or when it is not enabled.
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
        units = ctx.node.desired.services or expected_units(ctx.profile.hardware.nvswitch)
        result = ctx.output(("systemctl", "is-active", *units), ok_rcs=(0, 3, 4))
        kubelet_waiting = False
        if KUBELET in units and _state_of(units, result.stdout, KUBELET) != "active":
            enabled = ctx.output(("systemctl", "is-enabled", KUBELET), ok_rcs=(0, 1, 4))
            joined = ctx.output(("test", "-e", KUBELET_KUBECONFIG), ok_rcs=(0, 1))
            kubelet_waiting = enabled.stdout.strip() == "enabled" and joined.rc == 1
        return judge_services(units, result.stdout, kubelet_waiting)


KUBELET = "kubelet.service"
KUBELET_KUBECONFIG = "/etc/kubernetes/kubelet.conf"


def _state_of(units: tuple[str, ...], stdout: str, unit: str) -> str | None:
    states = stdout.split()
    return states[units.index(unit)] if len(states) == len(units) else None


def judge_services(units: tuple[str, ...], stdout: str,
                   kubelet_waiting_for_join: bool = False) -> list[Verdict]:
    """``systemctl is-active`` prints one state per unit, in order."""
    states = stdout.split()
    if len(states) != len(units):
        raise ToolFailure(
            CODE_PARSE,
            f"systemctl is-active: {len(states)} states for "
            f"{len(units)} units: {stdout.strip()[:200]}",
        )
    bad = [f"{u}={s}" for u, s in zip(units, states, strict=True)
           if s != "active" and not (u == KUBELET and kubelet_waiting_for_join)]
    return [
        Verdict(
            "inactive_units",
            Status.FAIL if bad else Status.PASS,
            "node.services.inactive" if bad else "ok",
            ", ".join(bad) or ("kubelet enabled, waiting for kubeadm join"
                               if kubelet_waiting_for_join else ""),
            float(len(bad)),
            "units",
        )
    ]


CHECKS: tuple[Check, ...] = (NodeServices(),)
