"""The cluster layer and the acceptance on the lab's control plane (``make demo``, the tests).

What a site installs before ``playbooks/cluster.yml`` and ``playbooks/acceptance.yml``, done the
lab's way:

- **The GPU Operator's ClusterPolicy CRD**, from the pinned release's own file
  (tests/fixtures/crds/gpu-operator-v26.7.0, SOURCES.tsv). Only the CRD: no operator runs in
  the lab (its images cannot be pulled); the lab's SIMULATED device plugin reads what
  ``cluster apply`` writes, as the operator's config-manager hands it to the real one.
- **Kueue**, for real: lab/kueue/install.py (built from source, the release's manifests).
- **The acceptance image** into the GPU hosts' containerd (lab/kube/acceptance_image.py).
- **Pod Security that lets the lab's Pods use the host network** for as long as the acceptance
  runs (:func:`host_network_allowed`): the lab's CNI makes no network namespace, so its Pods
  use the host's, which a team's ``restricted`` level forbids; the level is put back after.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence

import yaml

from lab import controlplane
from lab.core import LabState
from lab.errors import LabError
from lab.fleet import CONTROL_PLANE, REAL
from lab.kube import acceptance_image
from lab.kube import build as kube_build
from lab.kueue import install as kueue_install
from lab.paths import REPO_ROOT, LabPaths

CLUSTER_POLICY_CRD = (REPO_ROOT / "tests/fixtures/crds/gpu-operator-v26.7.0"
                      / "nvidia.com_clusterpolicies.yaml")
OPERATOR_NAMESPACE = "gpu-operator"
ENFORCE = "pod-security.kubernetes.io/enforce"


def kubectl(paths: LabPaths, *args: str, stdin: str | None = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """The built kubectl as the lab's admin; ``check``: a LabError naming the command."""
    argv = [str(kube_build.bin_dir() / "kubectl"), "--kubeconfig",
            str(controlplane.admin_kubeconfig(paths)), *args]
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and proc.returncode != 0:
        raise LabError(f"kubectl {shlex.join(args)}: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc


def prepare(paths: LabPaths, state: LabState) -> float:
    """The ClusterPolicy CRD, the operator's namespace and Kueue; the seconds it took."""
    started = time.monotonic()
    kubectl(paths, "apply", "--server-side", "-f", str(CLUSTER_POLICY_CRD))
    kubectl(paths, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}}))
    kubectl(paths, "wait", "--for=condition=Established", "--timeout=60s",
            "crd/clusterpolicies.nvidia.com")
    kueue_install.install(paths, state)
    return time.monotonic() - started


def gpu_kubelet_hosts(state: LabState) -> list[str]:
    return [h.name for h in state.hosts if h.kind != CONTROL_PLANE and h.kubernetes == REAL]


def load_acceptance_image(paths: LabPaths, hosts: Sequence[str]) -> None:
    for name in hosts:
        acceptance_image.load(paths, name)


@contextlib.contextmanager
def host_network_allowed(paths: LabPaths, namespaces: Sequence[str]) -> Iterator[None]:
    """Each namespace's Pod Security ``enforce`` at ``privileged`` for the duration, then back
    at the level it had (module docstring)."""
    before: dict[str, str] = {}
    for ns in namespaces:
        found = kubectl(paths, "get", "namespace", ns, "-o",
                        "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}")
        before[ns] = found.stdout.strip()
        kubectl(paths, "label", "namespace", ns, f"{ENFORCE}=privileged", "--overwrite")
    try:
        yield
    finally:
        for ns, level in before.items():
            change = f"{ENFORCE}={level}" if level else f"{ENFORCE}-"
            kubectl(paths, "label", "namespace", ns, change, "--overwrite")
