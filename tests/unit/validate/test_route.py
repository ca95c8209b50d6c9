"""validate/transport/route.py: the route to a node read as Ansible's ssh reads it (issue 9).

Inventory settings first, then ``ansible_ssh_common_args``/``ansible_ssh_extra_args``, then the
ssh config file (``-F``; ~/.ssh/config by default), first value wins, as OpenSSH does."""

from __future__ import annotations

from pathlib import Path

import pytest

from validate.transport.route import Hop, RouteError, resolve


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return path


def test_plain_inventory_settings(tmp_path: Path) -> None:
    known = tmp_path / "known"
    route = resolve("gpu1", {"ansible_host": "10.0.0.5", "ansible_port": 2222,
                             "ansible_user": "ops", "ansible_ssh_private_key_file": "/k/id",
                             "gpuready_ssh_known_hosts": str(known),
                             "ansible_ssh_common_args": f"-F {_config(tmp_path, '')}"})
    assert route.target == Hop("gpu1", "10.0.0.5", 2222, "ops", (Path("/k/id"),))
    assert route.jumps == ()
    assert route.proxy_command is None
    assert route.known_hosts[0] == known


def test_proxyjump_in_common_args_completed_from_ssh_config(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "Host bastion\n  HostName 192.0.2.1\n  User jump\n  Port 2200\n"
                            "  IdentityFile /k/bastion\n")
    uk = tmp_path / "uk"
    route = resolve("gpu1", {
        "ansible_host": "10.0.0.5", "ansible_ssh_private_key_file": "/k/node",
        "ansible_ssh_common_args": f"-F {cfg} -o ProxyJump=bastion,admin@hop2:2022 "
                                   f"-o UserKnownHostsFile={uk}"})
    assert route.jumps == (Hop("bastion", "192.0.2.1", 2200, "jump", (Path("/k/bastion"),)),
                           Hop("hop2", "hop2", 2022, "admin", (Path("/k/node"),)))
    assert route.known_hosts == (uk,)


def test_ssh_config_supplies_what_the_inventory_leaves_out(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "Host gpu-*\n  ProxyJump root@192.0.2.9\n  User admin\n"
                            "  Port 2201\n  UserKnownHostsFile /a/kh /b/kh\n")
    route = resolve("gpu-7", {"ansible_ssh_extra_args": f"-F {cfg}"})
    assert route.target == Hop("gpu-7", "gpu-7", 2201, "admin", ())
    assert route.jumps == (Hop("192.0.2.9", "192.0.2.9", 22, "root", ()),)
    assert route.known_hosts == (Path("/a/kh"), Path("/b/kh"))


def test_inventory_wins_over_args_and_args_over_config(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "Host *\n  User cfguser\n  Port 2300\n")
    route = resolve("n", {"ansible_user": "inv", "ansible_ssh_common_args": f"-F {cfg} -p 2400"})
    assert (route.target.user, route.target.port) == ("inv", 2400)


def test_proxycommand_tokens_are_expanded(tmp_path: Path) -> None:
    route = resolve("n", {"ansible_host": "10.1.1.1", "ansible_user": "u",
                          "ansible_ssh_common_args":
                              f"-F {_config(tmp_path, '')} "
                              "-o 'ProxyCommand=ssh -W %h:%p -l %r bastion 100%%'"})
    assert route.proxy_command == "ssh -W 10.1.1.1:22 -l u bastion 100%"


@pytest.mark.parametrize(("args", "message"), [
    ("-o ProxyJump=b -o ProxyCommand=x", "both ProxyJump and ProxyCommand"),
    ("-J", "-J has no value"),
    ("-o ProxyJump=u@:22", "names no host"),
    ("-J b:99999", "not a TCP port"),
    ("-o 'unterminated", "not a valid command line"),
    ("-F /nonexistent/ssh_config", "does not exist"),
])
def test_bad_settings_name_the_option(args: str, message: str) -> None:
    with pytest.raises(RouteError, match=message):
        resolve("n", {"ansible_ssh_common_args": args})


def test_global_known_hosts_files_are_trusted_as_openssh_reads_them(tmp_path: Path) -> None:
    known, user, site = tmp_path / "inventory_kh", tmp_path / "uk", tmp_path / "global_kh"
    route = resolve("n", {"gpuready_ssh_known_hosts": str(known),
                          "ansible_ssh_common_args":
                              f"-F {_config(tmp_path, '')} -o UserKnownHostsFile={user} "
                              f"-o GlobalKnownHostsFile={site}"})
    assert route.known_hosts == (known, user, site)
    # Named as none (/dev/null): none; the default /etc/ssh/ssh_known_hosts only where it is.
    route = resolve("n", {"ansible_ssh_common_args":
                          f"-F {_config(tmp_path, '')} -o UserKnownHostsFile={user} "
                          "-o GlobalKnownHostsFile=/dev/null"})
    assert route.known_hosts == (user,)
