"""Parser for ``nvidia-smi -L`` (``--list-gpus``): the GPUs and, under each GPU in MIG mode, its
MIG devices with the profile names nvidia-smi gives them.

``parse(text) -> tuple[ListedGpu, ...]``. Schema::

    ListedGpu
      index: int                        "GPU 0: ..." as printed
      name: str                         "NVIDIA H100 80GB HBM3"
      uuid: str | None                  "GPU-..."
      mig_devices: tuple[ListedMig, ...]   in output order; () when MIG is off
    ListedMig
      index: int                        "Device  0" (the MIG device index on its GPU)
      profile: str                      "3g.40gb", "1c.3g.71gb" (a compute instance that uses
                                        part of its GPU instance), "1g.10gb+me"
      uuid: str | None                  "MIG-..." (R470+), "MIG-GPU-.../1/0" (R450)

``nvidia-smi -q``/``-q -x`` list the same MIG devices by index, SMs and memory but without a
profile name; ``-L`` is where nvidia-smi prints the name (real captures:
fixtures/nvidia-smi-captures/*-mig__590.48.01.txt, "capabilities :: list (-L)").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validate.parsers import ParseError

FORMAT = "nvidia-smi-list"

_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: (?P<uuid>[^)]*)\))?$")
_MIG = re.compile(
    r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]*)\)$")


@dataclass(frozen=True)
class ListedMig:
    index: int
    profile: str
    uuid: str | None


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str | None
    mig_devices: tuple[ListedMig, ...] = ()


def parse(text: str) -> tuple[ListedGpu, ...]:
    """Parse ``nvidia-smi -L`` output (schema in the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise ParseError(FORMAT, "empty output")
    gpus: list[tuple[re.Match[str], list[ListedMig]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        gpu = _GPU.match(line)
        if gpu:
            gpus.append((gpu, []))
            continue
        mig = _MIG.match(line)
        if mig and gpus:
            gpus[-1][1].append(ListedMig(int(mig["index"]), mig["profile"], mig["uuid"]))
            continue
        raise ParseError(FORMAT, f"line {number}: not a GPU or MIG device line: {line[:120]!r}")
    return tuple(ListedGpu(int(m["index"]), m["name"], m["uuid"], tuple(migs))
                 for m, migs in gpus)
