"""``ibstat`` -> ``tuple[IbCa, ...]`` and ``ibstatus`` -> ``tuple[IbStatusPort, ...]``.

``ibstat`` prints one block per channel adapter (CA)::

    CA 'mlx5_0'
            CA type: MT4129
            Number of ports: 1
            Firmware version: 28.41.1000
            Hardware version: 0
            Node GUID: 0x58a2e10300a7820e
            System image GUID: 0x58a2e10300a7820e
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 400
                    Base lid: 128
                    LMC: 0
                    SM lid: 1
                    Capability mask: 0xa751e848
                    Port GUID: 0x58a2e10300a7820e
                    Link layer: InfiniBand

Indentation is tabs on real output and spaces where it was copied from a terminal; both parse.

When ibstat cannot stat a device it prints ``ibpanic: [pid] main: stat of IB device 'mlx5_8'
failed: ...`` after the CAs it did read and exits 255. Those CAs are complete and are returned
by :func:`parse`; :func:`parse_report` also returns the ``ibpanic`` lines so a check can name the
device that is missing. A CA block cut short (no port, or a port without State, Physical state,
Rate or Link layer) is truncated output and raises :class:`ParseError`.

Output schema::

    IbCa(name, ca_type, num_ports: int, firmware, hardware_version, node_guid,
         system_image_guid, ports: tuple[IbPort])
      IbPort(number, state ("Active"|"Down"|"Initializing"|...),
             physical_state ("LinkUp"|"Polling"|"Disabled"|...), rate_gbps: float,
             base_lid: int|None, lmc: int|None, sm_lid: int|None,
             capability_mask: str|None, port_guid: str|None, link_layer ("InfiniBand"|"Ethernet"))
        .active: state == "Active" and physical_state == "LinkUp"
    IbstatReport(cas: tuple[IbCa], errors: tuple[str])   # errors = ibpanic lines

    IbStatusPort(device, port, default_gid, base_lid: int, sm_lid: int, state ("ACTIVE"),
                 state_code: int, physical_state ("LinkUp"), physical_state_code: int,
                 rate_gbps: float, rate_detail ("4X HDR"), link_layer)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from validate.parsers import ParseError, finite

FORMAT = "ibstat"
IBSTATUS_FORMAT = "ibstatus"

_CA_RE = re.compile(r"^CA '(?P<name>[^']+)'\s*$")
_PORT_RE = re.compile(r"^Port (?P<num>\d+):\s*$")
_FIELD_RE = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]*?):\s*(?P<value>.*?)\s*$")
_PANIC_RE = re.compile(r"^ibpanic:.*$")
_REQUIRED_PORT_KEYS = ("State", "Physical state", "Rate", "Link layer")

_STATUS_DEV_RE = re.compile(r"^Infiniband device '(?P<dev>[^']+)' port (?P<port>\d+) status:\s*$")
_STATUS_FIELD_RE = re.compile(r"^\s+(?P<key>[a-z_ ]+?):\s+(?P<value>.*?)\s*$")
_CODE_VALUE_RE = re.compile(r"^(?P<code>\d+):\s*(?P<name>\S.*)$")
_RATE_RE = re.compile(r"^(?P<rate>[\d.]+) Gb/sec(?: \((?P<detail>[^)]*)\))?$")


@dataclass(frozen=True)
class IbPort:
    """One port of a CA, as ibstat reports it."""

    number: int
    state: str
    physical_state: str
    rate_gbps: float
    base_lid: int | None
    lmc: int | None
    sm_lid: int | None
    capability_mask: str | None
    port_guid: str | None
    link_layer: str

    @property
    def active(self) -> bool:
        """Logically Active and physically LinkUp: the port carries traffic."""
        return self.state == "Active" and self.physical_state == "LinkUp"


@dataclass(frozen=True)
class IbCa:
    """One channel adapter (HCA) block."""

    name: str
    ca_type: str
    num_ports: int
    firmware: str
    hardware_version: str | None
    node_guid: str | None
    system_image_guid: str | None
    ports: tuple[IbPort, ...]


@dataclass(frozen=True)
class IbstatReport:
    """Every complete CA plus the ``ibpanic`` lines ibstat printed after them."""

    cas: tuple[IbCa, ...]
    errors: tuple[str, ...]


@dataclass(frozen=True)
class IbStatusPort:
    """One ``Infiniband device 'X' port N status:`` block of ``ibstatus``."""

    device: str
    port: int
    default_gid: str
    base_lid: int
    sm_lid: int
    state: str
    state_code: int
    physical_state: str
    physical_state_code: int
    rate_gbps: float
    rate_detail: str | None
    link_layer: str


def parse(text: str) -> tuple[IbCa, ...]:
    """Parse ``ibstat`` output into its CAs (see :func:`parse_report` for ibpanic lines)."""
    return parse_report(text).cas


def parse_report(text: str) -> IbstatReport:
    """Parse ``ibstat`` output into CAs and ``ibpanic`` error lines."""
    if not text.strip():
        raise ParseError(FORMAT, "empty output")
    blocks: list[tuple[str, dict[str, str], list[tuple[int, dict[str, str]]]]] = []
    errors: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if match := _CA_RE.match(line):
            blocks.append((match["name"], {}, []))
        elif _PANIC_RE.match(line):
            errors.append(line)
        elif not blocks:
            raise ParseError(FORMAT, f"unexpected line before the first CA: {line[:120]!r}")
        elif match := _PORT_RE.match(line):
            blocks[-1][2].append((int(match["num"]), {}))
        elif match := _FIELD_RE.match(line):
            _name, ca_fields, ports = blocks[-1]
            target = ports[-1][1] if ports else ca_fields
            target[match["key"]] = match["value"]
        else:
            raise ParseError(FORMAT, f"unrecognised line in CA {blocks[-1][0]!r}: {line[:120]!r}")
    if not blocks:
        reason = f"no CA in output; tool error: {errors[0]}" if errors else "no CA in output"
        raise ParseError(FORMAT, reason)
    return IbstatReport(cas=tuple(_ca(*block) for block in blocks), errors=tuple(errors))


def parse_ibstatus(text: str) -> tuple[IbStatusPort, ...]:
    """Parse ``ibstatus`` output (one block per device port)."""
    if not text.strip():
        raise ParseError(IBSTATUS_FORMAT, "empty output")
    blocks: list[tuple[str, int, dict[str, str]]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if match := _STATUS_DEV_RE.match(raw.strip()):
            blocks.append((match["dev"], int(match["port"]), {}))
        elif blocks and (match := _STATUS_FIELD_RE.match(raw)):
            blocks[-1][2][match["key"]] = match["value"]
        else:
            raise ParseError(IBSTATUS_FORMAT, f"unrecognised line: {raw.strip()[:120]!r}")
    if not blocks:
        raise ParseError(IBSTATUS_FORMAT, "no device in output")
    return tuple(_status_port(*block) for block in blocks)


def _opt_int(value: str | None) -> int | None:
    return int(value, 0) if value is not None else None


def _ca(name: str, fields: dict[str, str], ports: list[tuple[int, dict[str, str]]]) -> IbCa:
    missing = [key for key in ("CA type", "Firmware version") if key not in fields]
    if missing or not ports:
        raise ParseError(FORMAT, f"CA {name!r} is incomplete (truncated output?)")
    try:
        return IbCa(
            name=name,
            ca_type=fields["CA type"],
            num_ports=int(fields.get("Number of ports", str(len(ports)))),
            firmware=fields["Firmware version"],
            hardware_version=fields.get("Hardware version"),
            node_guid=fields.get("Node GUID"),
            system_image_guid=fields.get("System image GUID"),
            ports=tuple(_port(name, number, pf) for number, pf in ports),
        )
    except ValueError as exc:
        raise ParseError(FORMAT, f"CA {name!r}: bad value: {exc}") from None


def _port(ca: str, number: int, fields: dict[str, str]) -> IbPort:
    missing = [key for key in _REQUIRED_PORT_KEYS if key not in fields]
    if missing:
        raise ParseError(
            FORMAT, f"CA {ca!r} port {number} lacks {', '.join(missing)} (truncated output?)"
        )
    return IbPort(
        number=number,
        state=fields["State"],
        physical_state=fields["Physical state"],
        rate_gbps=finite(float(fields["Rate"]), FORMAT, f"CA {ca!r} port {number} Rate"),
        base_lid=_opt_int(fields.get("Base lid")),
        lmc=_opt_int(fields.get("LMC")),
        sm_lid=_opt_int(fields.get("SM lid")),
        capability_mask=fields.get("Capability mask"),
        port_guid=fields.get("Port GUID"),
        link_layer=fields["Link layer"],
    )


def _status_port(device: str, port: int, fields: dict[str, str]) -> IbStatusPort:
    try:
        state = _CODE_VALUE_RE.match(fields["state"])
        phys = _CODE_VALUE_RE.match(fields["phys state"])
        rate = _RATE_RE.match(fields["rate"])
        if not (state and phys and rate):
            raise ValueError("state, phys state or rate not in the ibstatus form")
        return IbStatusPort(
            device=device,
            port=port,
            default_gid=fields["default gid"],
            base_lid=int(fields["base lid"], 0),
            sm_lid=int(fields["sm lid"], 0),
            state=state["name"],
            state_code=int(state["code"]),
            physical_state=phys["name"],
            physical_state_code=int(phys["code"]),
            rate_gbps=float(rate["rate"]),
            rate_detail=rate["detail"],
            link_layer=fields["link_layer"],
        )
    except (KeyError, ValueError) as exc:
        raise ParseError(
            IBSTATUS_FORMAT, f"device {device!r} port {port}: incomplete block ({exc})"
        ) from None
