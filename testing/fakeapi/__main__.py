"""Run the fake API server in its own process (demo, benchmarks, manual poking)::

    python -m gpudra.testing.fakeapi --port 8080 --node gpu-node-1

Prints the URL on the first line of stdout, then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from gpudra.testing.fakeapi.server import FakeApiServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpudra.testing.fakeapi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="create a Node object with this name (repeatable)")
    parser.add_argument("--bookmark-interval", type=float, default=60.0,
                        help="seconds between watch BOOKMARKs (default 60, like the apiserver)")
    parser.add_argument("--resource-api", choices=["v1", "v1beta2", "v1beta1"], default="v1",
                        help="the release to stand for: v1 (1.34+, default), v1beta2 (1.33) or "
                             "v1beta1 (1.32)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with FakeApiServer(port=args.port, bookmark_interval=args.bookmark_interval,
                       resource_api=args.resource_api) as server:
        for name in args.node:
            server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        print(server.url, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
