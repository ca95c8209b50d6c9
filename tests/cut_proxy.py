"""A ProxyCommand that stops taking the client's bytes part way through a session.

    python -m tests.cut_proxy HOST PORT CUT_AFTER MARKER

Relays stdin to a TCP connection to HOST:PORT and that connection back to stdout, like
``nc`` or ``ssh -W``. Once CUT_AFTER bytes have come back from the server it closes its stdin
(the client's next write into the pipe fails with EPIPE), writes its pid to MARKER, and keeps
relaying the server's bytes to stdout until the server closes. It is a bastion that
half-closed, or a proxy that died on one side: the connection still delivers output, but
nothing the client sends (a window adjust, a channel close) arrives. Only loopback addresses
are accepted.
"""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import sys


def main(argv: list[str]) -> int:
    host, port, cut_after, marker = argv[0], int(argv[1]), int(argv[2]), argv[3]
    if not ipaddress.ip_address(host).is_loopback:
        print(f"cut_proxy: {host} is not a loopback address", file=sys.stderr)
        return 2
    conn = socket.create_connection((host, port))
    relayed = 0
    reading_stdin = True
    # One thread, select(): no read of stdin is in flight when it is closed, so the pipe has
    # no reader from that moment on.
    while True:
        ready, _, _ = select.select([conn, 0] if reading_stdin else [conn], [], [])
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:
                reading_stdin = False
            else:
                conn.sendall(data)
        if conn in ready:
            data = conn.recv(65536)
            if not data:
                break
            os.write(1, data)
            relayed += len(data)
            if relayed >= cut_after and reading_stdin:
                reading_stdin = False
                os.close(0)  # the client's next write into the pipe gets EPIPE
                with open(marker, "w") as f:
                    f.write(f"{os.getpid()} cut after {relayed} bytes from the server\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
