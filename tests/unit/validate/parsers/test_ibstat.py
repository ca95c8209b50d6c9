"""ibstat / ibstatus parsers against every real capture in fixtures/ibstat."""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.parsers import ParseError, ibstat
from validate.parsers.ibstat import IbPort


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "ibstat" / name).read_text()


def test_h100_ndr400_space_indented(fixtures_dir: Path) -> None:
    cas = ibstat.parse(_read(fixtures_dir, "ibstat-h100-node-all-active-ndr400-spaces.txt"))
    assert [ca.name for ca in cas] == [
        "mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9",
        "mlx5_bond_0",
    ]  # fmt: skip
    compute = [ca for ca in cas if ca.ca_type == "MT4129"]
    assert len(compute) == 8
    assert {ca.firmware for ca in compute} == {"28.41.1000"}
    assert all(
        p.active and p.rate_gbps == 400.0 and p.link_layer == "InfiniBand"
        for ca in compute
        for p in ca.ports
    )
    first = cas[0]
    assert (first.num_ports, first.hardware_version) == (1, "0")
    assert first.node_guid == first.system_image_guid == "0x58a2e10300a7820e"
    assert first.ports == (
        IbPort(
            number=1,
            state="Active",
            physical_state="LinkUp",
            rate_gbps=400.0,
            base_lid=128,
            lmc=0,
            sm_lid=1,
            capability_mask="0xa751e848",
            port_guid="0x58a2e10300a7820e",
            link_layer="InfiniBand",
        ),
    )
    bond = cas[-1]
    assert (bond.ca_type, bond.firmware) == ("MT41692", "32.38.3056")
    assert (bond.ports[0].link_layer, bond.ports[0].rate_gbps) == ("Ethernet", 200.0)
    assert bond.ports[0].base_lid == 0


def test_a100_tab_indented_mixed_link_layers(fixtures_dir: Path) -> None:
    cas = ibstat.parse(_read(fixtures_dir, "ibstat-a100-node-all-active.txt"))
    assert len(cas) == 9
    assert {ca.ca_type for ca in cas} == {"MT4126"}
    assert (cas[0].name, cas[0].firmware, cas[0].ports[0].link_layer) == (
        "mlx5_0",
        "22.35.2302",
        "Ethernet",
    )
    infiniband = cas[1:]
    assert {ca.firmware for ca in infiniband} == {"28.37.1014"}
    assert {p.sm_lid for ca in infiniband for p in ca.ports} == {83}
    assert [ca.ports[0].base_lid for ca in infiniband] == [
        1369, 1372, 1374, 1379, 1383, 1387, 1392, 1396,
    ]  # fmt: skip
    assert all(ca.ports[0].rate_gbps == 200.0 and ca.ports[0].active for ca in cas)


def test_ibpanic_exit_255_keeps_complete_cas(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "ibstat-a100-azure-hdr200-ibpanic-exit255.txt")
    report = ibstat.parse_report(text)
    # The 8 CAs printed before the panic are whole; the panic names the one that is missing.
    assert [ca.name for ca in report.cas] == [f"mlx5_{i}" for i in range(8)]
    assert report.errors == (
        "ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory",
    )
    assert ibstat.parse(text) == report.cas
    assert {ca.ca_type for ca in report.cas} == {"MT4124"}
    assert {ca.firmware for ca in report.cas} == {"20.41.1000"}
    assert report.cas[7].ports[0].base_lid == 13305
    assert report.cas[7].ports[0].port_guid == "0x00155dfffd3411f2"
    assert all(ca.ports[0].rate_gbps == 200.0 for ca in report.cas)


def test_port_down_is_parsed_not_rejected(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, "ibstat-h100-node-all-active-ndr400-spaces.txt")
    # Same capture with the first port taken down, as ibstat prints a port without a link.
    down = text.replace("State: Active", "State: Down", 1).replace(
        "Physical state: LinkUp", "Physical state: Disabled", 1
    )
    port = ibstat.parse(down)[0].ports[0]
    assert (port.state, port.physical_state, port.active) == ("Down", "Disabled", False)


def test_truncated_ca_block(fixtures_dir: Path) -> None:
    lines = _read(fixtures_dir, "ibstat-h100-node-all-active-ndr400-spaces.txt").splitlines()
    # Cut after "Port 1:" of the last CA.
    cut = "\n".join(lines[: len(lines) - 9])
    with pytest.raises(ParseError, match=r"mlx5_bond_0.*truncated"):
        ibstat.parse(cut)
    with pytest.raises(ParseError, match="incomplete"):
        ibstat.parse("\n".join(lines[:3]))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "command not found: ibstat",
        "ibpanic: [1] main: stat of IB device 'mlx5_0' failed: No such file or directory",
    ],
)
def test_empty_or_garbage(text: str) -> None:
    with pytest.raises(ParseError) as info:
        ibstat.parse(text)
    assert info.value.fmt == "ibstat"


def test_ibpanic_without_cas_quotes_panic() -> None:
    with pytest.raises(ParseError, match="stat of IB device 'mlx5_0' failed"):
        ibstat.parse("ibpanic: [1] main: stat of IB device 'mlx5_0' failed: No such file")


def test_ibstatus(fixtures_dir: Path) -> None:
    ports = ibstat.parse_ibstatus(_read(fixtures_dir, "ibstatus-a100-hdr200-all-active.txt"))
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(9)]
    first = ports[0]
    assert first == ibstat.IbStatusPort(
        device="mlx5_0",
        port=1,
        default_gid="fe80:0000:0000:0000:0015:5dff:fd34:11eb",
        base_lid=0x33BF,
        sm_lid=1,
        state="ACTIVE",
        state_code=4,
        physical_state="LinkUp",
        physical_state_code=5,
        rate_gbps=200.0,
        rate_detail="4X HDR",
        link_layer="InfiniBand",
    )
    last = ports[-1]
    assert (last.default_gid, last.rate_gbps, last.rate_detail, last.link_layer) == (
        "unknown",
        40.0,
        "4X QDR",
        "Ethernet",
    )


def test_ibstatus_garbage_and_truncation(fixtures_dir: Path) -> None:
    lines = _read(fixtures_dir, "ibstatus-a100-hdr200-all-active.txt").splitlines()
    with pytest.raises(ParseError, match="incomplete"):
        ibstat.parse_ibstatus("\n".join(lines[:5]))
    for text in ("", "garbage line"):
        with pytest.raises(ParseError):
            ibstat.parse_ibstatus(text)


@pytest.mark.parametrize("bad", ["nan", "inf", "NaN"])
def test_non_finite_rate_is_rejected(fixtures_dir: Path, bad: str) -> None:
    text = _read(fixtures_dir, "ibstat-h100-node-all-active-ndr400-spaces.txt")
    assert "Rate: 400" in text
    with pytest.raises(ParseError, match="not a finite number"):
        ibstat.parse_report(text.replace("Rate: 400", f"Rate: {bad}", 1))
