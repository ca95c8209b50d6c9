"""Host keys for every Ansible run the suite starts: drift's check mode, the lab tests, the
benches. Each verifies host keys against the same files the validators trust and writes none.

Why this is needed: ansible-runner sets ``ANSIBLE_HOST_KEY_CHECKING=False`` unless told
otherwise, and Ansible then puts ``-o StrictHostKeyChecking=no`` on ssh's command line before
the inventory's own ``ansible_ssh_common_args``. OpenSSH takes the first value of an option, so
the inventory's ``StrictHostKeyChecking=yes`` lost, a host with an unknown or changed key was
connected to anyway, and its key was written into the user's ``~/.ssh/known_hosts`` for every
later run to trust. The validators (paramiko, validate/transport/ssh.py) refused those hosts.

What a run gets from :func:`trusted_ssh`:

- ``ANSIBLE_HOST_KEY_CHECKING=True`` in its environment, and ``ansible_host_key_checking: true``
  as an extra variable (extra variables beat any inventory that turns it off);
- per host, ``ansible_ssh_args`` (an extra variable, so it beats the inventory; ssh_args come
  first on ssh's command line, so its options beat every later one) made of::

      -o StrictHostKeyChecking=yes -o UpdateHostKeys=no
      -o UserKnownHostsFile="<the files the validators trust for this host>"
      -o GlobalKnownHostsFile=/dev/null   (the global files are in the list above)
      <the host's own ansible_ssh_args, else Ansible's configured ssh_args>

  The files are the route's (validate/transport/route.py): the inventory's
  ``gpuready_ssh_known_hosts``, then the ``UserKnownHostsFile``/``GlobalKnownHostsFile`` OpenSSH
  would read for that host (args, ssh config, defaults that exist). None at all is
  ``/dev/null``: every key is unknown, as it is to the validators.
- a host whose unknown keys are accepted (``gpuready_ssh_accept_unknown_host_keys``, or the
  caller's ``accept_unknown_host_keys``) gets ``StrictHostKeyChecking=accept-new`` with a
  file of the run's own scratch directory first in the list: ssh writes new keys only to the
  first file, so they live as long as the run; a changed key is still refused.

With ``StrictHostKeyChecking=yes`` OpenSSH never writes a known_hosts file, and
``UpdateHostKeys=no`` stops it adding a server's further keys after authentication.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validate.inventory import SshHost, ssh_hosts

REPO_ROOT = Path(__file__).resolve().parent.parent
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
# The extra variable holding each host's ssh arguments (the template below picks its own).
ARGS_VAR = "gpuready_trusted_ssh_args"
DEFAULT_ARGS_VAR = "gpuready_trusted_ssh_args_default"
NEW_KEYS_FILE = "accepted_known_hosts"


@dataclass(frozen=True, slots=True)
class TrustedSsh:
    """What an ansible-runner (or ansible-playbook) run needs to verify host keys.

    ``envvars`` and ``extravars`` go to the run; ``known_hosts`` says per host which files it
    verifies against (for messages)."""

    envvars: Mapping[str, str]
    extravars: Mapping[str, Any]
    known_hosts: Mapping[str, tuple[Path, ...]]


def configured_ssh_args(config: Path = ANSIBLE_CFG) -> str:
    """Ansible's ``ssh_args`` for a run reading ``config`` (its environment included)."""
    from ansible import constants  # noqa: PLC0415  (heavy import)
    from ansible.plugins.loader import connection_loader  # noqa: PLC0415

    connection_loader.get("ssh", class_only=True)  # loads the plugin's option definitions
    value = constants.config.get_config_value("ssh_args", cfile=str(config),
                                              plugin_type="connection", plugin_name="ssh")
    return str(value or "")


def host_key_options(known_hosts: Sequence[Path], new_keys: Path | None = None) -> list[str]:
    """The ssh options that make OpenSSH verify against ``known_hosts`` and write nothing
    (``new_keys``: accept unknown keys into this file only)."""
    files = [*([new_keys] if new_keys is not None else []), *known_hosts]
    # OpenSSH reads the value as a list of blank-separated, optionally double-quoted files.
    listed = " ".join(f'"{f}"' if any(c.isspace() for c in str(f)) else str(f) for f in files)
    return ["-o", f"StrictHostKeyChecking={'accept-new' if new_keys else 'yes'}",
            "-o", "UpdateHostKeys=no",
            "-o", f"UserKnownHostsFile={listed or '/dev/null'}",
            "-o", "GlobalKnownHostsFile=/dev/null"]


def _args(host: SshHost, base: str, new_keys: Path | None) -> str:
    own = host.ssh_args if host.ssh_args is not None else base
    return " ".join([shlex.join(host_key_options(host.route.known_hosts, new_keys)), own]).strip()


def trusted_ssh(inventory: Path, scratch: Path, *, limit: str | None = None,
                accept_unknown_host_keys: bool = False, config: Path = ANSIBLE_CFG,
                control_dir: Path | None = None) -> TrustedSsh:
    """The settings for one run against ``inventory`` (see the module docstring). ``scratch``
    is a directory of the run's own (the accepted-keys file goes there, when any host accepts
    unknown keys). ``control_dir``: a directory of the run's own for ssh's master sockets, so
    that :func:`stop_masters` can end them afterwards. Raises InventoryError."""
    base = configured_ssh_args(config)
    new_keys = scratch / NEW_KEYS_FILE
    per_host: dict[str, str] = {}
    known: dict[str, tuple[Path, ...]] = {}
    for host in ssh_hosts(inventory, limit):
        accept = accept_unknown_host_keys or host.accept_unknown_host_keys
        per_host[host.name] = _args(host, base, new_keys if accept else None)
        known[host.name] = host.route.known_hosts
    # A host the inventory does not name (an implicit localhost, one added with add_host):
    # OpenSSH's own default files, verified the same way.
    from validate.transport.route import resolve  # noqa: PLC0415

    default = _args(SshHost("", "ssh", resolve("", {}), None, False), base,
                    new_keys if accept_unknown_host_keys else None)
    envvars = {"ANSIBLE_HOST_KEY_CHECKING": "True"}
    if control_dir is not None:
        envvars["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(control_dir)
    extravars: dict[str, Any] = {
        "ansible_host_key_checking": True,
        "ansible_ssh_host_key_checking": True,
        "ansible_ssh_args": (f"{{{{ {ARGS_VAR}[inventory_hostname]"
                             f" | default({DEFAULT_ARGS_VAR}) }}}}"),
        ARGS_VAR: per_host,
        DEFAULT_ARGS_VAR: default,
    }
    return TrustedSsh(envvars, extravars, known)


def runner_settings(inventory: Path, scratch: Path, *, envvars: Mapping[str, str] | None = None,
                    extravars: Mapping[str, Any] | None = None, limit: str | None = None,
                    accept_unknown_host_keys: bool = False, config: Path = ANSIBLE_CFG,
                    control_dir: Path | None = None) -> dict[str, Any]:
    """``envvars`` and ``extravars`` for ``ansible_runner.run``: the caller's, with the trust
    settings over them (a caller cannot turn host key checking off by accident)."""
    trust = trusted_ssh(inventory, scratch, limit=limit,
                        accept_unknown_host_keys=accept_unknown_host_keys, config=config,
                        control_dir=control_dir)
    return {"envvars": {**(envvars or {}), **trust.envvars},
            "extravars": {**(extravars or {}), **trust.extravars}}


def stop_masters(control_dir: Path, timeout_s: float = 5.0) -> list[str]:
    """Ask every ssh master whose socket is in ``control_dir`` to exit (``ssh -O exit``): an
    interrupted or finished run leaves no ``ControlPersist`` master behind. Returns the sockets
    whose master did not confirm."""
    left: list[str] = []
    if not control_dir.is_dir():
        return left
    for sock in sorted(control_dir.iterdir()):
        if not sock.is_socket():
            continue
        try:
            proc = subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "gpuready"],
                                  capture_output=True, timeout=timeout_s, check=False)
            if proc.returncode != 0:
                left.append(sock.name)
        except (OSError, subprocess.TimeoutExpired):
            left.append(sock.name)
    return left


__all__ = ["TrustedSsh", "host_key_options", "runner_settings", "stop_masters", "trusted_ssh"]
