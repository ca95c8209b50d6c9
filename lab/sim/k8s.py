#!/usr/bin/env python3
"""gpuready lab simulator: `kubeadm version` and `kubectl version --client`.

The command is env GPUREADY_SIM_TOOL (kubeadm | kubectl), the version env GPUREADY_SIM_VERSION
(e.g. 1.30.5). Shapes, from public captures of the real v1.30 binaries:
  kubeadm version            -> kubeadm version: &version.Info{Major:"1", Minor:"30",
                                GitVersion:"v1.30.5", GitCommit:"...", GitTreeState:"clean",
                                BuildDate:"...", GoVersion:"go1.22.6", Compiler:"gc",
                                Platform:"linux/amd64"}
  kubeadm version -o short   -> v1.30.5
  kubeadm version -o json    -> {"clientVersion": {major, minor, gitVersion, ...}} (indented)
  kubectl version --client   -> Client Version: v1.30.5 / Kustomize Version: v5.0.4-...
  kubectl version --client -o json|yaml -> {"clientVersion": {...}, "kustomizeVersion": "..."}
The simulator is named only in the human output (an extra last line), never inside -o data.
Build metadata (commit, build date, Go version) is the real release's for 1.30.4 and 1.30.5;
other versions carry the simulator's name in gitCommit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SIMULATOR = "gpuready lab simulator"
KUSTOMIZE = "v5.0.4-0.20230601165947-6ce0bf390ce3"
# Release metadata of the real builds, as `kubeadm version` prints them.
RELEASES = {
    "1.30.4": ("a51b3b711150f57ffc1f526a640ec058514ed596", "2024-08-14T19:02:46Z", "go1.22.5"),
    "1.30.5": ("74e84a90c725047b1328ff3d589fedb1cb7a120e", "2024-09-12T00:17:07Z", "go1.22.6"),
}


def version_info(version: str) -> dict[str, str]:
    """The version.Info fields in the order Kubernetes prints them."""
    commit, build_date, go_version = RELEASES.get(
        version, (SIMULATOR, "1970-01-01T00:00:00Z", "go1.22.6")
    )
    major, minor = version.split(".")[:2]
    return {
        "major": major, "minor": minor, "gitVersion": f"v{version}", "gitCommit": commit,
        "gitTreeState": "clean", "buildDate": build_date, "goVersion": go_version,
        "compiler": "gc", "platform": "linux/amd64",
    }


def _output_format(args: list[str]) -> str:
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(("-o=", "--output=")):
            return arg.split("=", 1)[1]
        if arg.startswith("-o") and len(arg) > 2:
            return arg[2:]
    return ""


def _yaml(doc: dict[str, Any], indent: int = 0) -> str:
    out = ""
    for key, value in doc.items():
        if isinstance(value, dict):
            out += " " * indent + f"{key}:\n" + _yaml(value, indent + 2)
        else:
            # sigs.k8s.io/yaml quotes strings YAML would read as numbers or timestamps.
            quote = value.isdigit() or (value[:4].isdigit() and "T" in value)
            out += " " * indent + f"{key}: {json.dumps(value) if quote else value}\n"
    return out


def kubeadm(args: list[str], version: str) -> int:
    if not args or args[0] != "version":
        print(f"kubeadm: only `kubeadm version` is simulated here ({SIMULATOR})", file=sys.stderr)
        return 1
    info = version_info(version)
    fmt = _output_format(args)
    if fmt == "short":
        print(info["gitVersion"])
    elif fmt == "json":
        print(json.dumps({"clientVersion": info}, indent=2))
    elif fmt == "yaml":
        sys.stdout.write(_yaml({"clientVersion": info}))
    elif fmt == "":
        fields = ", ".join(f'{k[0].upper()}{k[1:]}:"{v}"' for k, v in info.items())
        print(f"kubeadm version: &version.Info{{{fields}}}")
        print(f"# {SIMULATOR}")
    else:
        print(f"error: invalid output format: {fmt}", file=sys.stderr)
        return 1
    return 0


def kubectl(args: list[str], version: str) -> int:
    if not args or args[0] != "version" or "--client" not in args:
        print(
            f"kubectl: only `kubectl version --client` is simulated here ({SIMULATOR})",
            file=sys.stderr,
        )
        return 1
    info = version_info(version)
    doc = {"clientVersion": info, "kustomizeVersion": KUSTOMIZE}
    fmt = _output_format(args)
    if fmt == "json":
        print(json.dumps(doc, indent=2))
    elif fmt == "yaml":
        sys.stdout.write(_yaml(doc))
    elif fmt == "":
        print(f"Client Version: {info['gitVersion']}\nKustomize Version: {KUSTOMIZE}")
        print(f"# {SIMULATOR}")
    else:
        print(f"error: --output {fmt} is not available", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    tool = os.environ.get("GPUREADY_SIM_TOOL", "kubectl")
    version = os.environ.get("GPUREADY_SIM_VERSION", "1.30.5")
    if tool == "kubeadm":
        return kubeadm(argv[1:], version)
    return kubectl(argv[1:], version)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
