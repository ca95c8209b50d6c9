"""`python -m validate fabric` and the opt-in fabric.nccl_pair check set of `validate run`,
in-process, against nodes that really cannot be reached (closed ports)."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pandas as pd

from validate.cli import main
from validate.model import ExitCode


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _inventory(root: Path, pool_vars: str = "") -> Path:
    (root / "group_vars").mkdir(parents=True)
    hosts = "".join(f"            gpu-{i}: {{ansible_host: 127.0.0.1, ansible_port: "
                    f"{_closed_port()}}}\n" for i in (1, 2))
    (root / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      children:\n        pool_h100_sxm:\n"
        f"          hosts:\n{hosts}")
    (root / "group_vars" / "pool_h100_sxm.yml").write_text(
        "gpu_profile: h100-sxm5-80gb-8x\ngpu_pool: {fabric: infiniband}\n"
        "gpuready_ssh_accept_unknown_host_keys: true\n" + pool_vars)
    return root


def test_checks_lists_the_multi_node_check_as_opt_in() -> None:
    code, out, _ = _main("checks")
    assert code == ExitCode.OK
    assert any(line.startswith("fabric.nccl_pair") and "only when --checks names it" in line
               for line in out.splitlines())


def test_fabric_unreachable_nodes_are_error_rows_naming_the_pair(tmp_path: Path) -> None:
    inv = _inventory(tmp_path / "inv")
    code, _, err = _main("fabric", "-i", str(inv), "--out", str(tmp_path / "r"),
                           "--run-id", "f1")
    assert code == ExitCode.UNREACHABLE, err
    assert "[fabric pass 1] gpu-1 -> gpu-2: error host.unreachable" in err
    rows = pd.read_parquet(tmp_path / "r" / "f1" / "results.parquet")
    assert list(rows["node"]) == ["gpu-1", "gpu-2"]
    assert set(rows["check"]) == {"fabric.nccl_pair"}
    launcher = rows[rows["node"] == "gpu-1"].iloc[0]
    # The launcher could not be reached: its own error; its peer was never tested.
    assert (launcher["status"], launcher["code"]) == ("error", "host.unreachable")
    assert "pair gpu-1-gpu-2" in launcher["detail"]
    peer = rows[rows["node"] == "gpu-2"].iloc[0]
    assert (peer["status"], peer["code"]) == ("error", "fabric.nccl_pair.unresolved")
    pairs = pd.read_csv(tmp_path / "r" / "f1" / "fabric_pairs.csv")
    assert list(pairs[["pass", "launcher", "peer", "status"]].itertuples(index=False,
                                                                          name=None)) == [
        (1, "gpu-1", "gpu-2", "error")]


def test_bad_fabric_variables_stop_before_any_node_is_touched(tmp_path: Path) -> None:
    inv = _inventory(tmp_path / "inv", "gpuready_fabric_nccl_ib_gid_index: three\n")
    code, _, err = _main("fabric", "-i", str(inv), "--out", str(tmp_path / "r"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR
    assert ("gpuready_fabric_nccl_ib_gid_index (set in group pool_h100_sxm, hosts gpu-1, "
            "gpu-2) is 'three', not a non-negative integer") in err
    assert "nothing was connected to" in err
    assert "[fabric pass" not in err and not (tmp_path / "r").exists()
    code, _, err = _main("run", "-i", str(inv), "--checks", "fabric.*",
                         "--out", str(tmp_path / "r"))
    assert code == ExitCode.USAGE_OR_TOOL_ERROR and "gid_index" in err


def test_run_takes_the_pair_check_only_when_named(tmp_path: Path) -> None:
    inv = _inventory(tmp_path / "inv")
    code, _, err = _main("run", "-i", str(inv), "--checks", "gpu.count", "--out",
                         str(tmp_path / "r"), "--run-id", "plain")
    rows = pd.read_parquet(tmp_path / "r" / "plain" / "results.parquet")
    assert set(rows["check"]) == {"gpu.count"} and "[fabric" not in err
    assert not (tmp_path / "r" / "plain" / "fabric_pairs.csv").exists()
    code, _, err = _main("run", "-i", str(inv), "--checks", "gpu.count,fabric.nccl_pair",
                         "--out", str(tmp_path / "r"), "--run-id", "both")
    assert code == ExitCode.UNREACHABLE
    rows = pd.read_parquet(tmp_path / "r" / "both" / "results.parquet")
    assert sorted(set(rows["check"])) == ["fabric.nccl_pair", "gpu.count"]
    assert (tmp_path / "r" / "both" / "fabric_pairs.csv").exists()
