"""MIG (Multi-Instance GPU) as a pool declares it: which sharing modes are MIG, the profile names
each accelerator offers, and the per-GPU layout (``gpu_mig_layout``) read by validate.desired.

A pool is a MIG pool when ``gpu_pool.sharing`` is ``mig``, ``mig-mixed`` or ``mig-<profile>``
(the GPU Operator's single strategy: every MIG device is that profile). Its layout names the MIG
devices of every GPU, as ``nvidia-smi -L`` names them::

    gpu_mig_layout: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]        # every GPU alike
    gpu_mig_layout: {0: [7g.80gb], 1: [1g.10gb, 1g.10gb, ...]}   # per GPU index

A name is a GPU instance profile (``3g.40gb``, ``1g.10gb+me``) or a compute instance that uses
part of a GPU instance (``1c.3g.71gb``: one of the 3g.71gb instance's three slices; real
capture: fixtures/nvidia-smi-captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# GPU instance profiles per accelerator (gpu_pool.accelerator's normalised names), from NVIDIA's
# Multi-Instance GPU User Guide, "Supported MIG Profiles"
# (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): the
# A100-80GB/H100-80GB names follow the memory proportion of the 40GB table.
GPU_INSTANCE_PROFILES: dict[str, tuple[str, ...]] = {
    "a30-24gb": ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"),
    "a100-40gb": ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "a100-80gb": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                  "7g.80gb"),
    "h100-80gb": ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                  "7g.80gb"),
    "h100-94gb": ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb",
                  "7g.94gb"),
    "h100-96gb": ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb",
                  "7g.96gb"),
    "h200-141gb": ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                   "7g.141gb"),
    "b200-180gb": ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb",
                   "7g.180gb"),
}

# "<c>c.<g>g.<mem>gb": a compute instance of c slices in a g-slice GPU instance (c < g).
_COMPUTE_INSTANCE = re.compile(r"^(?P<c>[1-9])c\.(?P<gi>(?P<g>[1-9])g\.\d+gb)$")


def is_mig_sharing(sharing: object) -> bool:
    """Whether ``gpu_pool.sharing`` declares a MIG pool."""
    return isinstance(sharing, str) and (sharing == "mig" or sharing.startswith("mig-"))


def known_profile(accelerator: str, name: str) -> bool:
    """Whether ``name`` is a MIG device name a GPU of ``accelerator`` can have."""
    profiles = GPU_INSTANCE_PROFILES.get(accelerator, ())
    if name in profiles:
        return True
    ci = _COMPUTE_INSTANCE.match(name)
    return bool(ci and ci["gi"] in profiles and int(ci["c"]) < int(ci["g"]))


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A MIG pool's declared MIG devices: ``every_gpu`` for all GPUs alike, or ``per_gpu`` by
    GPU index (a GPU it does not name has no declared layout)."""

    every_gpu: tuple[str, ...] | None = None
    per_gpu: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def for_gpu(self, index: int) -> tuple[str, ...] | None:
        return self.every_gpu if self.every_gpu is not None else self.per_gpu.get(index)


class LayoutError(ValueError):
    """A declared layout that cannot be used; the message says what is wrong. ``in_pool``: the
    fault is in ``gpu_pool`` (a MIG pool without a layout, a sharing mode or accelerator
    without MIG profiles), not in the layout."""

    def __init__(self, reason: str, *, in_pool: bool = False) -> None:
        super().__init__(reason)
        self.in_pool = in_pool


def _names(where: str, value: Any, accelerator: str, single: str | None) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value:
        raise LayoutError(f"{where} is {value!r}, not a non-empty list of MIG profile names"
                          .lstrip())
    out = []
    for i, name in enumerate(value):
        if not isinstance(name, str):
            raise LayoutError(f"{where}[{i}] is {name!r}, not a MIG profile name")
        if not known_profile(accelerator, name):
            known = ", ".join(GPU_INSTANCE_PROFILES[accelerator])
            raise LayoutError(f"{where}[{i}] is {name!r}, not a MIG profile of {accelerator} "
                              f"(known: {known}; a compute instance is <c>c.<profile>)")
        if single is not None and name != single:
            raise LayoutError(f"{where}[{i}] is {name!r}, but gpu_pool.sharing mig-{single} "
                              f"declares every MIG device {single}")
        out.append(name)
    return tuple(out)


def read_layout(value: Any, pool: Mapping[str, Any]) -> MigLayout | None:
    """The layout ``gpu_mig_layout`` declares for a pool (``gpu_pool``): None for a pool that is
    not MIG and declares none. Raises LayoutError naming what is wrong: a layout on a pool that
    is not MIG, a MIG pool without one, an accelerator with no known MIG profiles, a name that
    is not a profile of the pool's accelerator."""
    sharing = pool.get("sharing")
    if not is_mig_sharing(sharing):
        if value is None:
            return None
        raise LayoutError(f"is set, but gpu_pool.sharing is {sharing!r}: only a MIG pool "
                          "(sharing mig, mig-mixed or mig-<profile>) has a MIG layout")
    assert isinstance(sharing, str)
    accelerator = str(pool.get("accelerator"))
    if accelerator not in GPU_INSTANCE_PROFILES:
        raise LayoutError(f"sharing is {sharing!r}, but accelerator {accelerator!r} has no known "
                          f"MIG profiles (MIG accelerators: {', '.join(GPU_INSTANCE_PROFILES)})",
                          in_pool=True)
    single = sharing.removeprefix("mig-") if sharing not in ("mig", "mig-mixed") else None
    if single is not None and not known_profile(accelerator, single):
        raise LayoutError(f"sharing {sharing!r} names no MIG profile of {accelerator} (known: "
                          f"{', '.join(GPU_INSTANCE_PROFILES[accelerator])})", in_pool=True)
    if value is None:
        raise LayoutError(f"sharing is {sharing!r}, but gpu_mig_layout is not set: declare the "
                          "MIG devices of each GPU there (a list for every GPU, or a mapping by "
                          "GPU index)", in_pool=True)
    if isinstance(value, Mapping):
        per_gpu: dict[int, tuple[str, ...]] = {}
        for key, names in value.items():
            if isinstance(key, bool) or not isinstance(key, int | str) or not str(key).isdigit():
                raise LayoutError(f"has the key {key!r}, not a GPU index")
            per_gpu[int(key)] = _names(f"[{key}]", names, accelerator, single)
        if not per_gpu:
            raise LayoutError("is an empty mapping: name the MIG devices of each GPU")
        return MigLayout(per_gpu=per_gpu)
    return MigLayout(every_gpu=_names("", value, accelerator, single))
