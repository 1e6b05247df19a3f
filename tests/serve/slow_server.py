"""`specpack serve` in a process of its own over a slowed-down pack, for the shutdown tests.

    python slow_server.py PACK PORT DELAY GRACE
"""

from __future__ import annotations

import sys
from pathlib import Path

from serve_harness import SlowPack

from specpack.serve.config import ServeConfig
from specpack.serve.server import load_pack, serve

if __name__ == "__main__":
    pack_dir, port, delay, grace = sys.argv[1:5]
    config = ServeConfig(Path(pack_dir), port=int(port), model_name="tiny", shutdown_grace_s=float(grace))
    pack = SlowPack(load_pack(config))
    pack.delay = float(delay)
    serve(config, pack)
