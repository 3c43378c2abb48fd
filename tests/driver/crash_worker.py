"""Run one prepare or unprepare in a separate process (which a crash point may kill)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.driver.node_fixture import claim, start_node


def main() -> None:
    root, action, uid, *devices = sys.argv[1:]
    node = start_node(Path(root))
    if action == "prepare":
        node.state.prepare(claim(uid, *devices))
    else:
        node.state.unprepare(uid)
    node.close()


if __name__ == "__main__":
    main()
