"""Log into a lab host as an unprivileged user, as real fleets are (issue 9).

A lab host is normally logged into as root. :func:`user_login` makes one like a site's node: a
user (``gpuready``) with the lab key, passwordless sudo (or none, to prove a missing right
is reported), and root login refused by sshd. The inventory then sets ``ansible_user`` to that
user and ``ansible_become: true``. It works inside the running host (``nsenter``, no SSH), so
it applies equally to a host whose root login is already off.
"""

from __future__ import annotations

import shlex

from lab.errors import LabError
from lab.hosts import host_exec
from lab.paths import LabPaths

LOGIN_USER = "gpuready"
SUDOERS = "/etc/sudoers.d/90-gpuready-lab-login"
NO_ROOT_LOGIN = "/etc/ssh/sshd_config.d/10-gpuready-lab-no-root-login.conf"

_SCRIPT = f"""set -e
user=$1 sudo=$2
id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
install -d -m 0700 -o "$user" -g "$user" "/home/$user/.ssh"
install -m 0600 -o "$user" -g "$user" /root/.ssh/authorized_keys "/home/$user/.ssh/authorized_keys"
if [ "$sudo" = yes ]; then
  printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\\n' "$user" > {SUDOERS}.new
  chmod 0440 {SUDOERS}.new
  /usr/sbin/visudo -cqf {SUDOERS}.new
  mv {SUDOERS}.new {SUDOERS}
else
  rm -f {SUDOERS}
fi
printf '# gpuready lab: log in as %s\\nPermitRootLogin no\\n' "$user" > {NO_ROOT_LOGIN}
/usr/sbin/sshd -t
# restart, not reload: a reload (SIGHUP) makes sshd re-exec and close its socket for a moment,
# and returns before it listens again; ssh.service is Type=notify, so restart returns once the
# new sshd listens. KillMode=process keeps open sessions.
systemctl restart ssh
"""


def user_login(paths: LabPaths, name: str, user: str = LOGIN_USER, sudo: bool = True) -> None:
    """Make host ``name`` refuse root logins and accept ``user`` (with the lab key), with
    passwordless sudo when ``sudo``, without any sudo right otherwise."""
    argv = ["sh", "-c", _SCRIPT, "gpuready-lab", user, "yes" if sudo else "no"]
    proc = host_exec(paths, name, argv, timeout=60)
    if proc.returncode != 0:
        raise LabError(f"{name}: cannot set up the {user} login: "
                       f"{(proc.stderr or proc.stdout).strip()[-300:]} ({shlex.join(argv[:2])})")
