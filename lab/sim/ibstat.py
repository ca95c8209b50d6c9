#!/usr/bin/env python3
"""gpuready lab simulator: `ibstat` (infiniband-diags) for the node's simulated HCAs.

Reads $GPUREADY_LAB_HW (default /opt/gpuready-lab/hw)/{hardware,faults}.json on every call;
the package version is env GPUREADY_SIM_VERSION.

Output, shaped like the real captures in tests/fixtures/ibstat (tab-indented, one block per
CA, one port each as on ConnectX HCAs):
    CA 'mlx5_0'
    \\tCA type: MT4129
    \\tNumber of ports: 1
    \\tFirmware version: 28.39.1002
    \\tHardware version: 0
    \\tNode GUID: 0x...
    \\tSystem image GUID: 0x...
    \\tPort 1:
    \\t\\tState: Active
    \\t\\tPhysical state: LinkUp
    \\t\\tRate: 400
    \\t\\tBase lid: N          (0 on Ethernet/RoCE ports)
    \\t\\tLMC: 0
    \\t\\tSM lid: 1            (0 on Ethernet/RoCE ports)
    \\t\\tCapability mask: 0x...
    \\t\\tPort GUID: 0x...
    \\t\\tLink layer: InfiniBand | Ethernet
Forms: `ibstat` (all CAs), `ibstat -l` (CA names), `ibstat -p` (port GUIDs), `ibstat -s`
(short), `ibstat <ca> [port]` (printed as the whole CA block), `ibstat -V`. An unknown CA
fails as the real tool does
(`ibpanic: [pid] main: stat of IB device 'X' failed: No such file or directory`, exit 255, as in
ibstat-a100-azure-hdr200-ibpanic-exit255.txt). A node without HCAs fails listing devices
(`ibpanic: [pid] main: can't list IB device names: No such file or directory`, exit 255; the
wording follows infiniband-diags' IBPANIC format, not a capture).

Fault ib-port-down: the first HCA's port is `State: Down`, `Physical state: Polling`,
`Rate: 10`, base and SM lid 0, as a port with no link shows. Fault ib-rail-down: the last
HCA's port is `State: Down`, `Physical state: Disabled` (its switch port was disabled), same
rate and lids. Fault ib-link-degraded changes nothing here: the port trained at full rate.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

SIMULATOR = "gpuready lab simulator"
DEFAULT_VERSION = "2410mlnx54"
# Capability masks as real ConnectX ports report them (fixtures: CX7 IB, CX6 Dx Ethernet).
CAP_MASK_IB = "0xa751e848"
CAP_MASK_ETH = "0x00010000"


def _hw_dir() -> Path:
    return Path(os.environ.get("GPUREADY_LAB_HW", "/opt/gpuready-lab/hw"))


def _load() -> tuple[dict[str, Any], set[str]]:
    hw: dict[str, Any] = json.loads((_hw_dir() / "hardware.json").read_text())
    faults_path = _hw_dir() / "faults.json"
    faults: set[str] = set()
    if faults_path.exists():
        faults = set(json.loads(faults_path.read_text()).get("faults", []))
    return hw, faults


def _guid(text: str, fallback_seed: str) -> str:
    if text:
        return "0x" + text.lower().removeprefix("0x").rjust(16, "0")
    return "0x" + hashlib.sha256(fallback_seed.encode()).hexdigest()[:16]


def _port(nic: dict[str, Any], down: str | None) -> dict[str, str]:
    """``down``: None for a healthy port, else its physical state (Polling: no link; Disabled:
    the switch port was disabled)."""
    ethernet = str(nic.get("link_layer", "InfiniBand")).lower() == "ethernet"
    port_guid = _guid(str(nic.get("port_guid", "")), nic["name"] + "port")
    # Lids are assigned by the subnet manager; derive a stable one from the GUID.
    base_lid = 0 if ethernet or down else 1 + int(port_guid, 16) % 1000
    return {
        "State": "Down" if down else "Active",
        "Physical state": down or "LinkUp",
        "Rate": "10" if down else str(int(nic.get("rate_gbps", 0))),
        "Base lid": str(base_lid),
        "LMC": "0",
        "SM lid": "0" if ethernet or down else "1",
        "Capability mask": CAP_MASK_ETH if ethernet else CAP_MASK_IB,
        "Port GUID": port_guid,
        "Link layer": "Ethernet" if ethernet else "InfiniBand",
    }


def _ca_block(nic: dict[str, Any], down: str | None, short: bool) -> str:
    node_guid = _guid(str(nic.get("node_guid", "")), nic["name"])
    image_guid = _guid(str(nic.get("system_image_guid", "")), nic["name"]) if nic.get(
        "system_image_guid"
    ) else node_guid
    port = _port(nic, down)
    if short:
        return (
            f"CA '{nic['name']}'\n\tCA type: {nic.get('ca_type', '')}\n\tNumber of ports: 1\n"
            f"\tFirmware version: {nic.get('fw', '')}\n\tHardware version: 0\n"
            f"\tNode GUID: {node_guid}\n\tSystem image GUID: {image_guid}\n"
        )
    lines = [
        f"CA '{nic['name']}'",
        f"\tCA type: {nic.get('ca_type', '')}",
        "\tNumber of ports: 1",
        f"\tFirmware version: {nic.get('fw', '')}",
        "\tHardware version: 0",
        f"\tNode GUID: {node_guid}",
        f"\tSystem image GUID: {image_guid}",
        "\tPort 1:",
    ]
    lines += [f"\t\t{key}: {value}" for key, value in port.items()]
    return "\n".join(lines) + "\n"


def _panic(message: str) -> int:
    sys.stdout.flush()
    print(f"ibpanic: [{os.getpid()}] main: {message}", file=sys.stderr)
    return 255


def main(argv: list[str]) -> int:
    args = argv[1:]
    version = os.environ.get("GPUREADY_SIM_VERSION", DEFAULT_VERSION)
    if any(a in ("-V", "--version") for a in args):
        print(f"ibstat BUILD VERSION: {version} ({SIMULATOR})")
        return 0
    if any(a in ("-h", "--help") for a in args):
        print(f"Usage: ibstat [options] <ca_name> [portnum]   ({SIMULATOR})")
        print("Options:\n  --list_of_cas, -l\tlist all IB devices\n  --short, -s\tshort output")
        print("  --port_list, -p\tshow port list\n  --version, -V\tshow version")
        return 0
    hw, faults = _load()
    nics: list[dict[str, Any]] = list(hw.get("nics", []))
    if not nics:
        return _panic("can't list IB device names: No such file or directory")
    down: dict[str, str] = {}
    if "ib-port-down" in faults:
        down[nics[0]["name"]] = "Polling"
    if "ib-rail-down" in faults:
        down[nics[-1]["name"]] = "Disabled"
    flags = {a for a in args if a.startswith("-")}
    positional = [a for a in args if not a.startswith("-")]
    if flags & {"-l", "--list_of_cas"}:
        for nic in nics:
            print(nic["name"])
        return 0
    selected = nics
    if positional:
        selected = [n for n in nics if n["name"] == positional[0]]
        if not selected:
            return _panic(
                f"stat of IB device '{positional[0]}' failed: No such file or directory"
            )
        if len(positional) > 1 and positional[1] != "1":
            return _panic(f"stat of IB device '{positional[0]}' port {positional[1]} failed")
    if flags & {"-p", "--port_list"}:
        for nic in selected:
            print(_guid(str(nic.get("port_guid", "")), nic["name"] + "port"))
        return 0
    short = bool(flags & {"-s", "--short"})
    sys.stdout.write("".join(_ca_block(n, down.get(n["name"]), short) for n in selected))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
