#!/usr/bin/env python3
"""Simulated ``dcgmi`` (NVIDIA DCGM's command line) for lab hosts (gpuready lab simulator).

Stdlib only, run from ``/opt/gpuready-lab/sim/`` behind the wrapper the simulated
``datacenter-gpu-manager`` package installs (``GPUREADY_SIM_VERSION`` is the DCGM version).

Supported: ``dcgmi diag -r|--run 1|2|3 [-j|--json]``, ``dcgmi --version``. Like the real tool
it needs the host engine: without a running ``nv-hostengine`` (its pid in
``$GPUREADY_LAB_RUN/nv-hostengine.pid``, written by the simulated daemon, lab/sim/daemons.py)
it prints DCGM's connection error and exits 235 (DCGM_ST_CONNECTION_NOT_VALID, -21).

Output is held to the real captures in tests/fixtures/dcgmi: the text table is DCGM 3.3's
(``diag-r2-p4de-8x-a100-80gb-dcgm3.3.3-pass.txt``, byte for byte on a healthy 8x A100 at level
2), a deployment error prints as ``diag-deployment-error-row-remap-pending-gpu3-excerpt.txt``
does, warnings are cut into 45-character pieces as in
``diag-r2-gpu-memory-fail-gpu0-thermal-warning-excerpt.txt``; the JSON (``-j``) of DCGM 3 is
DCGM 3.1's (``diag-j-8gpu-dcgm3.1.0-pass-nulls-leading-warning.txt``: jsoncpp's tab-indented
style, ``null`` between Deployment tests, upper-case statuses, a Custom ``software`` result per
GPU). Failure messages and error ids are DCGM's own (dcgmlib/dcgm_errors.h, Apache-2.0).

DCGM 4 (``GPUREADY_SIM_VERSION`` 4.x) prints DCGM 4's JSON document instead: no licensed real
capture of it was found, so it is held to NVIDIA's JSON Schema of that output, which NVIDIA's
own tests validate real ``dcgmi diag -j`` output against
(``tests/fixtures/dcgmi/schema-diag-json-dcgm4.6.0.json``), and written as DCGM 4.6.0's
dcgmi/Diag.cpp writes it (``HelperJsonBuildOutput``, jsoncpp's ``toStyledString``: keys in
byte order): ``"DCGM Diagnostic"`` > ``test_categories`` > tests named by their plugin
(``software``, ``pcie``, ``memory``, ``diagnostic``, ``targeted_stress``, ``targeted_power``,
``memory_bandwidth``), one result per GPU entity (``entity_group`` ``GPU``,
``entity_group_id`` 1, ``entity_id``, ``status`` ``Pass``/``Fail``, ``warnings`` objects) and
a ``test_summary``; ``entity_groups`` (each GPU's ``device_id`` and ``serial_num``) and
``metadata`` (``version``, ``Driver Version Detected``). Its text table stays DCGM 3.3's.

Levels: 1 runs the Deployment tests; 2 adds PCIe (Integration) and GPU Memory (Hardware); 3
adds Diagnostic, Targeted Stress, Targeted Power and Memory Bandwidth (level 3's test list is
DCGM 3.3's documented one; no real level-3 capture of a healthy node is in the fixtures). A
failed test makes dcgmi exit 226 (DCGM_ST_NVVS_ERROR, -30).

Faults (lab/hardware.py FAULTS): row-remap-pending (GPU 1: a deployment error at every
level), pcie-degraded (GPU 2: PCIe fails from level 2), gpu-memory-fail (GPU 0: GPU Memory
fails from level 2; nvidia-smi shows nothing), gpu-missing (one GPU fewer), driver-not-loaded
(the host engine does not start), tool-hang (hangs before printing anything).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SIMULATED = "gpuready lab simulator"

REMAP_GPU = 1  # as nvidia_smi.py's row-remap-pending
PCIE_GPU = 2  # as nvidia_smi.py's pcie-degraded
MEMORY_GPU = 0  # gpu-memory-fail
DEGRADED_GEN = 3  # the generation nvidia_smi.py's pcie-degraded trains at

RC_OK = 0
RC_NVVS_ERROR = 226  # DCGM_ST_NVVS_ERROR (-30) as an exit status
RC_CONNECTION = 235  # DCGM_ST_CONNECTION_NOT_VALID (-21)
RC_USAGE = 2

# DCGM's failure reasons (dcgm_errors.h): id, category, severity, message template. The row
# remap wording is the real capture's.
ROW_REMAP = (85, 4, 2, "GPU {gpu} has uncorrectable memory errors and row remappings are pending")
PCIE_GEN = (45, 3, 2, "GPU {gpu} is running at PCI link generation {gen}, which is below the "
                      "minimum allowed link generation of {min} (parameter 'min_pci_generation')")
MEMORY = (58, 1, 3, "A memory mismatch was detected on GPU {gpu}, but no error was reported by "
                    "CUDA or NVML.")

DEPLOYMENT = ("Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
              "Persistence Mode", "Environment Variables", "Page Retirement/Row Remap",
              "Graphics Processes", "Inforom")
# The JSON of DCGM 3.1 names two of them differently (real capture).
JSON_NAMES = {"Permissions and OS Blocks": "Permissions and OS-related Blocks",
              "Environment Variables": "Environmental Variables"}

NAME_W = 26  # text the first column holds
VALUE_W = 47  # the second column's width after its leading space
PIECE = 45  # how long a piece of a message is
BORDER = "+" + "-" * (NAME_W + 1) + "+" + "-" * (VALUE_W + 1) + "+"


# -- what the diagnostic finds -------------------------------------------------------------

def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _run_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_RUN", "/run/gpuready-lab"))


def _load() -> tuple[dict[str, Any], set[str]]:
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    path = _hw_dir() / "faults.json"
    faults = set(json.loads(path.read_text()).get("faults", [])) if path.exists() else set()
    return hw, faults


def hostengine_running() -> bool:
    try:
        pid = int((_run_dir() / "nv-hostengine.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()


class Finding:
    """One failed result: the test, the GPU, DCGM's reason."""

    def __init__(self, test: str, gpu: int, reason: tuple[int, int, int, str], **values: object
                 ) -> None:
        self.test = test
        self.gpu = gpu
        self.error_id, self.category, self.severity, template = reason
        self.message = template.format(gpu=gpu, **values)


def findings(hw: dict[str, Any], faults: set[str], level: int, gpus: int) -> list[Finding]:
    out: list[Finding] = []
    if "row-remap-pending" in faults and gpus > REMAP_GPU:
        out.append(Finding("Page Retirement/Row Remap", REMAP_GPU, ROW_REMAP))
    if level >= 2 and "pcie-degraded" in faults and gpus > PCIE_GPU:
        minimum = int(hw["gpus"][PCIE_GPU].get("pcie_gen_max", 4))
        out.append(Finding("PCIe", PCIE_GPU, PCIE_GEN, gen=DEGRADED_GEN, min=minimum))
    if level >= 2 and "gpu-memory-fail" in faults and gpus > MEMORY_GPU:
        out.append(Finding("GPU Memory", MEMORY_GPU, MEMORY))
    return out


def tests_for(level: int) -> list[tuple[str, str]]:
    """(section, test) run per GPU at ``level``, after the Deployment tests."""
    tests: list[tuple[str, str]] = []
    if level >= 2:
        tests += [("Integration", "PCIe"), ("Hardware", "GPU Memory")]
    if level >= 3:
        tests += [("Hardware", "Diagnostic"), ("Stress", "Targeted Stress"),
                  ("Stress", "Targeted Power"), ("Stress", "Memory Bandwidth")]
    return tests


# -- text ------------------------------------------------------------------------------------

def _row(name: str, value: str) -> str:
    return f"| {name:<{NAME_W}}| {value:<{VALUE_W}}|"


def _bar(section: str, edge: str) -> str:
    title = f"-----  {section}  "
    return f"{edge}{title:-<{NAME_W + 1}}+{'-' * (VALUE_W + 1)}{edge}"


def _message_rows(name: str, message: str) -> list[str]:
    pieces = [message[i:i + PIECE] for i in range(0, len(message), PIECE)] or [""]
    return [_row(name if i == 0 else "", piece) for i, piece in enumerate(pieces)]


def _who(gpus: list[int]) -> str:
    return f"GPU: {gpus[0]}" if len(gpus) == 1 else "GPUs: " + ", ".join(map(str, gpus))


def render_text(version: str, driver: str, device_ids: list[str], level: int,
                found: list[Finding]) -> str:
    lines = ["Successfully ran diagnostic for group.", BORDER,
             _row("Diagnostic", "Result"),
             "+" + "=" * (NAME_W + 1) + "+" + "=" * (VALUE_W + 1) + "+"]
    deployment = [f for f in found if f.test in DEPLOYMENT]
    if deployment:
        # A deployment error stops the run: DCGM prints the error alone (real capture).
        lines.append(_bar("Deployment", "|"))
        for f in deployment:
            lines += _message_rows("Error", f.message)
        lines.append(BORDER)
        return "\n".join(lines[1:]) + "\n"
    lines += [_bar("Metadata", "|"), _row("DCGM Version", version),
              _row("Driver Version Detected", driver),
              _row("GPU Device IDs Detected", ",".join(device_ids)),
              _bar("Deployment", "|")]
    lines += [_row(name, "Pass") for name in DEPLOYMENT]
    gpus = list(range(len(device_ids)))
    section = ""
    for sec, test in tests_for(level):
        if sec != section:
            lines.append(_bar(sec, "+"))
            section = sec
        failed = [f for f in found if f.test == test]
        bad = sorted({f.gpu for f in failed})
        good = [g for g in gpus if g not in bad]
        if not bad:
            lines.append(_row(test, "Pass - All"))
            continue
        results = ([f"Pass - {_who(good)}"] if good else []) + [f"Fail - {_who(bad)}"]
        lines += [_row(test if i == 0 else "", r) for i, r in enumerate(results)]
        for f in failed:
            lines += _message_rows("Warning", f.message)
    if level < 3:
        lines.append(_bar("Stress", "+"))
    lines.append(BORDER)
    return "\n".join(lines) + "\n"


# -- JSON (jsoncpp's styled writer, tab indented, as DCGM prints it) ------------------------

def _styled(value: Any, depth: int = 0) -> str:
    pad = "\t" * depth
    if isinstance(value, dict):
        out = [f"{pad}{{"]
        items = list(value.items())
        for i, (key, item) in enumerate(items):
            comma = "," if i < len(items) - 1 else ""
            if isinstance(item, dict | list):
                out.append(f"{pad}\t{json.dumps(key)} :")
                out.append(_styled(item, depth + 1) + comma)
            else:
                out.append(f"{pad}\t{json.dumps(key)} : {json.dumps(item)}{comma}")
        out.append(f"{pad}}}")
        return "\n".join(out)
    if isinstance(value, list):
        out = [f"{pad}["]
        for i, item in enumerate(value):
            comma = "," if i < len(value) - 1 else ""
            out.append((_styled(item, depth + 1) if isinstance(item, dict | list)
                        else f"{pad}\t{json.dumps(item)}") + comma)
        out.append(f"{pad}]")
        return "\n".join(out)
    return pad + json.dumps(value)


def _warning(f: Finding) -> dict[str, Any]:
    return {"error_category": f.category, "error_id": f.error_id,
            "error_severity": f.severity, "warning": f.message}


def render_json(version: str, gpus: int, level: int, found: list[Finding]) -> str:
    every = ",".join(str(g) for g in range(gpus))
    deployment: list[Any] = []
    for name in DEPLOYMENT:
        failed = [f for f in found if f.test == name]
        result: dict[str, Any] = {"gpu_ids": every, "status": "FAIL" if failed else "PASS"}
        if failed:
            result["warnings"] = [_warning(f) for f in failed]
        if deployment:
            deployment.append(None)  # DCGM 3.1 writes null between these tests (real capture)
        deployment.append({"name": JSON_NAMES.get(name, name), "results": [result]})
    categories: list[dict[str, Any]] = [{"category": "Deployment", "tests": deployment}]
    by_section: dict[str, list[Any]] = {}
    for section, test in tests_for(level):
        results = []
        for gpu in range(gpus):
            failed = [f for f in found if f.test == test and f.gpu == gpu]
            result = {"gpu_ids": gpu, "status": "FAIL" if failed else "PASS"}
            if failed:
                result["warnings"] = [_warning(f) for f in failed]
            results.append(result)
        by_section.setdefault(section, []).append({"name": test, "results": results})
    categories += [{"category": s, "tests": t} for s, t in by_section.items()]
    categories.append({"category": "Custom", "tests": [{"name": "software", "results": [
        {"gpu_ids": g, "status": "PASS"} for g in range(gpus)]}]})
    doc = {"DCGM GPU Diagnostic": {"test_categories": categories, "version": version}}
    return _styled(doc) + "\n"


# DCGM 4 names its tests by their plugin (nvvs/include/PluginStrings.h) in the categories of
# PLUGIN_CATEGORY_*; the Deployment tests of DCGM 3 are the one "software" test.
DCGM4_TESTS = {**dict.fromkeys(DEPLOYMENT, ("Deployment", "software")),
               "PCIe": ("Integration", "pcie"), "GPU Memory": ("Hardware", "memory"),
               "Diagnostic": ("Hardware", "diagnostic"),
               "Targeted Stress": ("Stress", "targeted_stress"),
               "Targeted Power": ("Stress", "targeted_power"),
               "Memory Bandwidth": ("Stress", "memory_bandwidth")}
GPU_GROUP, GPU_GROUP_ID = "GPU", 1  # DCGM_FE_GPU


def render_json4(version: str, driver: str, gpus: list[dict[str, Any]], level: int,
                 found: list[Finding]) -> str:
    """DCGM 4's ``dcgmi diag -j`` document (module docstring)."""
    order = [DEPLOYMENT[0]] + [test for _, test in tests_for(level)]
    categories: dict[str, list[dict[str, Any]]] = {}
    for test in order:
        category, name = DCGM4_TESTS[test]
        failed_tests = {t for t, (_, n) in DCGM4_TESTS.items() if n == name}
        results = []
        for gpu in range(len(gpus)):
            failed = [f for f in found if f.test in failed_tests and f.gpu == gpu]
            result: dict[str, Any] = {"entity_group": GPU_GROUP, "entity_group_id": GPU_GROUP_ID,
                                      "entity_id": gpu, "status": "Fail" if failed else "Pass"}
            if failed:
                result["warnings"] = [_warning(f) for f in failed]
            results.append(result)
        summary = "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"
        categories.setdefault(category, []).append(
            {"name": name, "results": results, "test_summary": {"status": summary}})
    entities = [{"device_id": str(g.get("pci_device_id", "0x0000"))[2:6].lower(),
                 "entity_id": i, **({"serial_num": str(g["serial"])} if g.get("serial") else {})}
                for i, g in enumerate(gpus)]
    metadata = {"version": version, **({"Driver Version Detected": driver} if driver else {})}
    doc = {"DCGM Diagnostic": {"test_categories": [
        {"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [{"entities": entities, "entity_group": GPU_GROUP,
                           "entity_group_id": GPU_GROUP_ID}],
        "metadata": metadata}
    return _styled(_sorted(doc)) + "\n"


def _sorted(value: Any) -> Any:
    """Objects with their keys in byte order, as jsoncpp keeps them."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


# -- the command ---------------------------------------------------------------------------

CONNECTION_ERROR = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)


def _driver() -> str:
    path = _run_dir() / "nvidia-module-version"
    return path.read_text().strip() if path.exists() else ""


def diag(args: list[str], version: str) -> tuple[str, int]:
    level: int | None = None
    as_json = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-r", "--run") and i + 1 < len(args):
            level = int(args[i + 1]) if args[i + 1] in ("1", "2", "3") else None
            if level is None:
                return f"Error: invalid run level {args[i + 1]!r}\n", RC_USAGE
            i += 2
            continue
        if arg in ("-j", "--json"):
            as_json = True
        i += 1
    if level is None:
        return "Error: dcgmi diag needs -r <level> (gpuready lab simulator: 1, 2 or 3)\n", RC_USAGE
    if not hostengine_running():
        return CONNECTION_ERROR, RC_CONNECTION
    hw, faults = _load()
    gpus = len(hw["gpus"]) - (1 if "gpu-missing" in faults else 0)
    found = findings(hw, faults, level, gpus)
    device_ids = [str(g.get("pci_device_id", "0x0000"))[2:6].lower() for g in hw["gpus"][:gpus]]
    if as_json and int(version.split(".", maxsplit=1)[0]) >= 4:
        out = render_json4(version, _driver(), hw["gpus"][:gpus], level, found)
    elif as_json:
        out = render_json(version, gpus, level, found)
    else:
        out = render_text(version, _driver(), device_ids, level, found)
    return out, RC_NVVS_ERROR if found else RC_OK


def main(argv: list[str]) -> int:
    version = os.environ.get("GPUREADY_SIM_VERSION", "3.3.6")
    args = argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(f"dcgmi ({SIMULATED}, DCGM {version}): dcgmi diag -r <1|2|3> [-j]")
        return RC_OK if args else RC_USAGE
    if args[0] in ("--version", "-v"):
        print(f"Version : {version}\n({SIMULATED})")
        return RC_OK
    _, faults = _load()
    if "tool-hang" in faults:
        while True:  # a wedged driver: the real tool blocks and prints nothing
            time.sleep(3600)
    if args[0] != "diag":
        print(f"Error: {args[0]!r} is not supported by the {SIMULATED}", file=sys.stderr)
        return RC_USAGE
    out, rc = diag(args[1:], version)
    sys.stdout.write(out)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
