"""lab/sim/k8s.py: kubeadm/kubectl version output in the real shapes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "lab" / "sim" / "k8s.py"


def run_sim(tool: str, *args: str, version: str = "1.30.5") -> str:
    env = {"GPUREADY_SIM_TOOL": tool, "GPUREADY_SIM_VERSION": version}
    out = subprocess.run([sys.executable, str(SIM), *args], env=env, capture_output=True,
                         text=True, timeout=10, check=True)
    return out.stdout


def test_kubeadm_version_forms():
    human = run_sim("kubeadm", "version").splitlines()
    # Published output of the real v1.30.5 kubeadm, field for field.
    assert human[0] == (
        'kubeadm version: &version.Info{Major:"1", Minor:"30", GitVersion:"v1.30.5", '
        'GitCommit:"74e84a90c725047b1328ff3d589fedb1cb7a120e", GitTreeState:"clean", '
        'BuildDate:"2024-09-12T00:17:07Z", GoVersion:"go1.22.6", Compiler:"gc", '
        'Platform:"linux/amd64"}'
    )
    assert "gpuready lab simulator" in human[1]
    assert run_sim("kubeadm", "version", "-o", "short") == "v1.30.5\n"
    doc = json.loads(run_sim("kubeadm", "version", "-o", "json", version="1.30.4"))
    assert doc["clientVersion"]["gitVersion"] == "v1.30.4"
    assert doc["clientVersion"]["gitCommit"] == "a51b3b711150f57ffc1f526a640ec058514ed596"


def test_kubectl_client_version_forms():
    human = run_sim("kubectl", "version", "--client")
    assert re.match(r"Client Version: v1\.30\.5\nKustomize Version: v5\.0\.4-\S+\n", human)
    raw = run_sim("kubectl", "version", "--client", "-o", "json")
    assert "simulator" not in raw
    doc = json.loads(raw)
    assert list(doc) == ["clientVersion", "kustomizeVersion"]
    assert list(doc["clientVersion"]) == [
        "major", "minor", "gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion",
        "compiler", "platform",
    ]
    assert doc["clientVersion"]["minor"] == "30"
