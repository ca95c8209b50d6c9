"""The CLI in-process: injected streams, exit codes from the one table, parse/report/run."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pandas as pd
import pytest

from validate.cli import PARSERS, main
from validate.model import ExitCode


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


REAL = {
    "nvidia-smi-xml": "nvidia-smi-xml/a100-sxm4-80gb-x4-drv535-v12.xml",
    "nvidia-smi-q": "nvidia-smi-q-text/h100-80gb-hbm3-x8-drv535.161.08-full.txt",
    "nvidia-smi-nvlink": "nvidia-smi-nvlink/a100-sxm4-80gb-nvlink-s-12links-ok.txt",
    "nvidia-smi-topo": "nvidia-smi-topo/dgx-a100-8gpu-nv12-12x-mlx5-4numa-tabs.txt",
    "nccl": "nccl-tests/all_reduce_perf-8x-a100-sxm4-80gb-single-node-nccl2.16.2.txt",
    "fio-json": "fio/fio-3.33-json-seqwrite-seqread-randread4k-3jobs-stonewall-vm-disk.json",
    "ibstat": "ibstat/ibstat-h100-node-all-active-ndr400-spaces.txt",
    "ibstatus": "ibstat/ibstatus-a100-hdr200-all-active.txt",
    "xid": "dmesg-xid/xid63-row-remapper-new-row-marked.txt",
    "nvidia-smi-csv": "nvidia-smi-csv/tesla-p100-query-gpu-header-units.csv",
    "dpkg-query": "drift-lab/dpkg-query-show-debian12-converged-node.txt",
    "containerd-config-dump": "drift-lab/containerd-1.6.20-config-dump-nvidia-runtime.toml",
}


def test_every_parser_format_is_reachable() -> None:
    assert set(REAL) | {"nccl-json"} == set(PARSERS)


@pytest.mark.parametrize("fmt", sorted(REAL))
def test_parse_prints_json_for_real_captures(fixtures_dir: Path, fmt: str) -> None:
    code, out, err = _main("parse", fmt, str(fixtures_dir / REAL[fmt]))
    assert (code, err) == (0, "")
    assert json.loads(out)


def test_parse_values_and_errors(fixtures_dir: Path, tmp_path: Path) -> None:
    _, out, _ = _main("parse", "nvidia-smi-nvlink", str(fixtures_dir / REAL["nvidia-smi-nvlink"]))
    doc = json.loads(out)
    assert doc[0]["index"] == 7 and doc[0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert len(doc[0]["links"]) == 12
    _, out, _ = _main("parse", "xid", str(fixtures_dir / REAL["xid"]))
    assert json.loads(out)[0]["xid"] == 63
    garbage = tmp_path / "g.xml"
    garbage.write_text("<nvidia_smi_log><gpu>")
    code, _, err = _main("parse", "nvidia-smi-xml", str(garbage))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "parse error" in err
    code, _, err = _main("parse", "nvidia-smi-xml", str(tmp_path / "missing"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "No such file" in err


def test_usage_errors_and_help() -> None:
    assert _main()[0] == ExitCode.USAGE_OR_TOOL_ERROR
    assert _main("parse", "no-such-format", "x")[0] == ExitCode.USAGE_OR_TOOL_ERROR
    code, out, _ = _main("--help")
    assert code == ExitCode.OK and "run" in out
    code, out, _ = _main("checks")
    assert code == ExitCode.OK and "nccl.allreduce" in out


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _inventory(root: Path, hosts: str) -> Path:
    (root / "group_vars").mkdir(parents=True)
    (root / "hosts.yml").write_text(hosts)
    (root / "group_vars" / "pool_h100_sxm.yml").write_text("gpu_profile: h100-sxm5-80gb-8x\n")
    return root


def test_run_unreachable_host_exit_3_and_rows(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path / "inv",
        f"""
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            dead-01: {{ansible_host: 127.0.0.1, ansible_port: {_closed_port()}}}
""",
    )
    code, out, err = _main(
        "run",
        "-i",
        str(inv),
        "--checks",
        "gpu.*,node.services",
        "--out",
        str(tmp_path / "reports"),
        "--run-id",
        "t1",
    )
    assert code == ExitCode.UNREACHABLE, err
    assert "[1/1] dead-01: error" in err and "report:" in out
    rows = pd.read_parquet(tmp_path / "reports" / "t1" / "results.parquet")
    assert len(rows) == 12 and set(rows["code"]) == {"host.unreachable"}
    # render again from the stored results: same verdict
    code, out, _ = _main("report", str(tmp_path / "reports" / "t1"))
    assert code == ExitCode.UNREACHABLE and "UNREACHABLE" in out


def test_run_local_connection_missing_tools_is_a_tool_error(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path / "inv",
        """
all:
  children:
    gpu_nodes:
      children:
        pool_h100_sxm:
          hosts:
            here: {ansible_connection: local}
""",
    )
    code, _, err = _main(
        "run",
        "-i",
        str(inv),
        "--checks",
        "fabric.ib",
        "--out",
        str(tmp_path / "reports"),
        "--run-id",
        "t2",
        "--limit",
        "here",
    )
    assert code in (ExitCode.USAGE_OR_TOOL_ERROR, ExitCode.CHECK_FAILED, ExitCode.OK), err
    rows = pd.read_csv(tmp_path / "reports" / "t2" / "results.csv")
    assert set(rows["node"]) == {"here"} and set(rows["check"]) == {"fabric.ib"}


def test_run_bad_inputs_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = _main("run", "-i", str(tmp_path / "nope"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "does not exist" in err
    inv = _inventory(
        tmp_path / "inv",
        "all:\n  children:\n    gpu_nodes:\n      children:\n"
        "        pool_h100_sxm:\n          hosts:\n            a: {}\n",
    )
    code, _, err = _main("run", "-i", str(inv), "--checks", "gpu.nope")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "no check matches" in err
    code, _, err = _main("run", "-i", str(inv), "--limit", "zzz")
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "no GPU nodes" in err
