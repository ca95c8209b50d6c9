"""``python -m lab.apiserver init|serve``: the lab's SIMULATED Kubernetes API server.

    init  --state DIR --address IP [--port 6443] [--hostname NAME]...   new cluster state;
          prints the admin token on stdout (it is also in DIR/tokens.csv, mode 0600)
    serve --state DIR --address IP [--bind IP] [--port 6443] [--faults-dir DIR]
          serve until SIGTERM/SIGINT; the state survives a restart
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from lab.apiserver import server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.apiserver",
                                     description="gpuready lab: SIMULATED kube-apiserver")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init")
    serve = sub.add_parser("serve")
    for p in (init, serve):
        p.add_argument("--state", type=Path, required=True)
        p.add_argument("--address", required=True, help="the address clients use")
        p.add_argument("--port", type=int, default=6443)
    init.add_argument("--hostname", action="append", default=[])
    serve.add_argument("--bind", help="listen address (default: --address)")
    serve.add_argument("--faults-dir", type=Path)
    serve.add_argument("--node-grace", type=float, default=40.0,
                       help="seconds without kubelet status before Ready turns Unknown")
    args = parser.parse_args(argv)
    if args.command == "init":
        args.state.mkdir(parents=True, exist_ok=True)
        print(server.init_state(args.state, args.address, args.port, tuple(args.hostname)))
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = server.Config(args.state, args.address, args.port, args.faults_dir,
                           args.node_grace)
    bind = args.bind or args.address

    def ready() -> None:
        print(f"lab.apiserver: serving https://{bind}:{args.port} ({server.SIMULATED}; "
              f"state {args.state})", file=sys.stderr, flush=True)

    server.serve(config, bind, ready=ready, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
