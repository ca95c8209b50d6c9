"""The lab's SIMULATED GPU Feature Discovery (lab/sim/daemons.py gfd_labels) held to the labels
the real GPU Operator puts on a Node (tests/fixtures/k8s-api: a real `kubectl get nodes -o json`
of a GPU Operator cluster): the same label names and value shapes, from the simulated hardware
as NVML would see it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.hardware import render_host
from lab.sim.daemons import GFD_KEYS, gfd_labels

REAL_NODES = "kubectl-get-nodes-o-json-list-rke2-vgpu-a16-4q-gpu-operator.json"


def _real_labels(fixtures_dir: Path) -> dict[str, str]:
    doc: dict[str, Any] = json.loads((fixtures_dir / "k8s-api" / REAL_NODES).read_text())
    labels: dict[str, str] = doc["items"][0]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize("faults", [set(), {"gfd-mismatch"}])
def test_every_label_is_one_the_real_gpu_operator_sets(fixtures_dir: Path,
                                                       faults: set[str]) -> None:
    real = _real_labels(fixtures_dir)
    labels = gfd_labels(render_host("h100-sxm5-8x", "n1"), faults, "550.90.07", 1796200000)
    assert set(labels) <= set(real)
    assert {"nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory"} <= \
        set(labels)
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"  # MiB, as NVML reports it
    product = labels["nvidia.com/gpu.product"]
    # GFD writes the product with '-' for spaces, as the real label does.
    assert " " not in product and " " not in real["nvidia.com/gpu.product"]
    assert product == ("NVIDIA-H100-80GB-HBM3" if not faults else "NVIDIA-A100-SXM4-80GB")
    # Versions split as the real labels split them.
    assert labels["nvidia.com/cuda.driver-version.full"] == "550.90.07"
    assert (labels["nvidia.com/cuda.driver-version.major"],
            labels["nvidia.com/cuda.driver-version.minor"],
            labels["nvidia.com/cuda.driver-version.revision"]) == ("550", "90", "07")
    assert real["nvidia.com/cuda.driver-version.full"].split(".")[0] == \
        real["nvidia.com/cuda.driver-version.major"]


def test_what_nvml_cannot_see_is_not_labelled() -> None:
    hw = render_host("h100-sxm5-8x", "n1")
    assert gfd_labels(hw, set(), None, 0) == {}  # no driver loaded: no NVML, no labels
    assert gfd_labels(hw, {"driver-not-loaded"}, "550.90.07", 0) == {}
    assert gfd_labels(hw, {"gpu-missing"}, "550.90.07", 0)["nvidia.com/gpu.count"] == "7"


def test_gfd_owns_exactly_the_labels_it_sets() -> None:
    """GFD changes and removes only its own labels: a label under nvidia.com/ that it does not
    set (the device plugin configuration label `validate cluster apply` puts on a Node) is
    someone else's, and a simulated GFD that removed it made every apply change the Node."""
    labels = gfd_labels(render_host("h100-sxm5-8x", "n1"), set(), "550.90.07", 1)
    assert set(labels) == GFD_KEYS
    assert "nvidia.com/device-plugin.config" not in GFD_KEYS
