"""Where and how to connect to a node, resolved as Ansible's ``ssh`` connection would.

Ansible runs OpenSSH with the inventory's settings as command-line options and
``ansible_ssh_common_args``/``ansible_ssh_extra_args`` after them; OpenSSH takes the first value
it finds for each option, command line first, then the user's ``~/.ssh/config`` (or ``-F
file``) for the host name it was given. :func:`resolve` reproduces that for the options the
validators need:

- target: ``HostName``, ``Port``, ``User``, ``IdentityFile`` (``ansible_host``/``ansible_port``/
  ``ansible_user``/``ansible_ssh_private_key_file`` first, then ``-o``/``-p``/``-l``/``-i`` in
  the args, then ssh config);
- the way there: ``ProxyJump`` (``-J`` or ``-o ProxyJump=``, each jump host itself looked up
  in ssh config) or ``ProxyCommand`` (``%h``, ``%p``, ``%r``, ``%%`` expanded);
- the host keys to verify against: the inventory's ``gpuready_ssh_known_hosts`` plus the
  ``UserKnownHostsFile`` and ``GlobalKnownHostsFile`` OpenSSH would read (args, ssh config,
  else ``~/.ssh/known_hosts`` and ``/etc/ssh/ssh_known_hosts`` where they exist). Ansible runs
  the suite starts are given the same files (validate/ansible_ssh.py).

Output: a :class:`Route`. Bad input (a ``-J`` with no host, a port that is not a port) is a
:class:`RouteError` naming the option. Options the validators cannot honour
(``ProxyJump`` and ``ProxyCommand`` together) are refused, not ignored.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
DEFAULT_KNOWN_HOSTS = (Path("~/.ssh/known_hosts"), Path("~/.ssh/known_hosts2"))
DEFAULT_GLOBAL_KNOWN_HOSTS = (Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2"))


class RouteError(ValueError):
    """A connection setting cannot be read; the message names the option."""


@dataclass(frozen=True, slots=True)
class Hop:
    """One SSH server on the way: a jump host, or the node itself."""

    name: str  # as written (a ssh config alias, an inventory name), for errors
    address: str
    port: int = 22
    user: str = "root"
    key_files: tuple[Path, ...] = ()

    def __str__(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class Route:
    """The node (``target``), the jump hosts in front of it in order, or a proxy command, and
    every known_hosts file whose keys are trusted (for every hop)."""

    target: Hop
    jumps: tuple[Hop, ...] = ()
    proxy_command: str | None = None
    known_hosts: tuple[Path, ...] = field(default_factory=tuple)


def _options(args: str, where: str) -> dict[str, str]:
    """The OpenSSH options in a command-line string, first value wins, keys lower-case."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise RouteError(f"{where} is not a valid command line: {exc}") from None
    flags = {"-J": "proxyjump", "-p": "port", "-l": "user", "-i": "identityfile",
             "-F": "configfile"}
    found: dict[str, str] = {}
    identity: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        key = value = ""
        if word == "-o" or word in flags:
            if i + 1 >= len(words):
                raise RouteError(f"{where}: {word} has no value")
            value, i = words[i + 1], i + 2
            key = flags.get(word, "")
            if not key:
                key, _, value = value.partition("=")
                if not _:
                    key, _, value = key.strip().partition(" ")
        elif word.startswith("-o") and len(word) > 2:
            key, _, value = word[2:].partition("=")
            i += 1
        elif word[:2] in flags and len(word) > 2:
            key, value, i = flags[word[:2]], word[2:], i + 1
        else:
            i += 1
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "identityfile":
            identity.append(value)
        elif key not in found:
            found[key] = value
    if identity:
        found["identityfile"] = "\n".join(identity)
    return found


def tcp_port(value: object, where: str) -> int:
    """``value`` as a TCP port; a RouteError naming ``where`` otherwise."""
    try:
        port = int(str(value))
    except ValueError:
        port = 0
    if isinstance(value, bool) or not 0 < port < 65536:
        raise RouteError(f"{where} is {value!r}, not a TCP port")
    return port


def _ssh_config(path: Path | None) -> paramiko.SSHConfig:
    if path is None:
        default = DEFAULT_SSH_CONFIG.expanduser()
        return paramiko.SSHConfig.from_path(str(default)) if default.is_file() else (
            paramiko.SSHConfig())
    if not path.is_file():
        raise RouteError(f"ssh config {path} (-F) does not exist")
    return paramiko.SSHConfig.from_path(str(path))


def _first(*values: object) -> str | None:
    for value in values:
        if value not in (None, ""):
            return str(value)
    return None


def _identity(*values: object) -> tuple[Path, ...]:
    for value in values:
        if not value:
            continue
        items = value if isinstance(value, list) else str(value).split("\n")
        return tuple(Path(str(v)).expanduser() for v in items if str(v).strip())
    return ()


def _jump(spec: str, config: paramiko.SSHConfig, fallback_keys: tuple[Path, ...]) -> Hop:
    """``[user@]host[:port]`` (or ``ssh://user@host:port``), completed from ssh config."""
    text = spec.removeprefix("ssh://")
    user, _, hostport = text.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":")
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    if not host:
        raise RouteError(f"ProxyJump {spec!r} names no host")
    looked = config.lookup(host)
    return Hop(
        name=host,
        address=str(looked.get("hostname", host)),
        port=tcp_port(_first(port, looked.get("port"), 22), f"ProxyJump {spec!r} port"),
        user=_first(user, looked.get("user"), "root") or "root",
        # A jump host with no key of its own is tried with the node's (a common bastion setup);
        # the ssh-agent is offered at every hop.
        key_files=_identity(looked.get("identityfile")) or fallback_keys,
    )


def _expand(command: str, hop: Hop) -> str:
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command):
            token = command[i + 1]
            out.append({"h": hop.address, "p": str(hop.port), "r": hop.user, "n": hop.name,
                        "%": "%"}.get(token, command[i:i + 2]))
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def _known_hosts(inventory_file: Path | None, options: Mapping[str, str],
                 looked: Mapping[str, object]) -> tuple[Path, ...]:
    files: list[Path] = [inventory_file] if inventory_file is not None else []
    for option, defaults in (("userknownhostsfile", DEFAULT_KNOWN_HOSTS),
                             ("globalknownhostsfile", DEFAULT_GLOBAL_KNOWN_HOSTS)):
        named = _first(options.get(option), looked.get(option))
        candidates: Iterable[Path] = (
            [Path(p) for p in shlex.split(named)] if named else defaults)
        for path in candidates:
            full = path.expanduser()
            if str(path) == "/dev/null":
                continue
            # OpenSSH skips a default file that does not exist; a named one is read (and fails).
            if full not in files and (named or full.is_file()):
                files.append(full)
    return tuple(files)


def resolve(name: str, hostvars: Mapping[str, object], default_user: str = "root") -> Route:
    """The route to inventory host ``name`` from its (templated) Ansible variables."""
    options: dict[str, str] = {}
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        for key, value in _options(str(hostvars.get(var) or ""), var).items():
            options.setdefault(key, value)
    config_file = options.get("configfile")
    config = _ssh_config(Path(config_file).expanduser() if config_file else None)
    given = str(hostvars.get("ansible_host") or name)
    looked = config.lookup(given)
    port_var = "ansible_port" if hostvars.get("ansible_port") not in (None, "") else (
        "the Port option")
    target = Hop(
        name=name,
        address=_first(options.get("hostname"), looked.get("hostname"), given) or given,
        port=tcp_port(_first(hostvars.get("ansible_port"), options.get("port"), looked.get("port"),
                          22), port_var),
        user=_first(hostvars.get("ansible_user"), options.get("user"), looked.get("user"),
                    default_user) or default_user,
        key_files=_identity(hostvars.get("ansible_ssh_private_key_file"),
                            options.get("identityfile"), looked.get("identityfile")),
    )
    jump_spec = _first(options.get("proxyjump"), looked.get("proxyjump"))
    proxy = _first(options.get("proxycommand"), looked.get("proxycommand"))
    if jump_spec and jump_spec.lower() == "none":
        jump_spec = None
    if proxy and proxy.lower() == "none":
        proxy = None
    if jump_spec and proxy:
        raise RouteError(f"host {name}: both ProxyJump and ProxyCommand are set; OpenSSH "
                         "uses whichever comes first, set only one")
    jumps = tuple(_jump(s.strip(), config, target.key_files)
                  for s in (jump_spec.split(",") if jump_spec else []))
    known = hostvars.get("gpuready_ssh_known_hosts")
    return Route(
        target=target,
        jumps=jumps,
        proxy_command=_expand(proxy, target) if proxy else None,
        known_hosts=_known_hosts(Path(str(known)).expanduser() if known else None, options,
                                 looked),
    )


__all__ = ["Hop", "Route", "RouteError", "resolve", "tcp_port"]
