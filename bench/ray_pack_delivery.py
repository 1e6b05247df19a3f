"""`--pack-delivery object-store` on a real pack: the driver's put, a replica's copy (in a Ray task: another
process) and its pinned load, timed (bench/README.md, "Ray Serve replicas").

    PYTHONPATH=$PWD python bench/ray_pack_delivery.py PACK [--copies 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ray

import specpack
from specpack.contract.manifest import manifest_sha256
from specpack.serve.pack_copy import remove_copy
from specpack.serve.ray_objects import ShippedPack, fetch_pack, put_pack


@ray.remote(num_cpus=1)
def copy_and_load(shipped: ShippedPack) -> tuple[float, float]:
    """(seconds to copy, seconds of the pinned load) in a worker process, as a replica's constructor does."""
    start = time.monotonic()
    copy = fetch_pack(shipped)
    copied = time.monotonic()
    try:
        specpack.load(copy, manifest_sha256=shipped.pin).close()
    finally:
        remove_copy(copy)
    return copied - start, time.monotonic() - copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--copies", type=int, default=2, help="copies in turn (the first on a cold node cache)")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        shipped = put_pack(args.pack, manifest_sha256(args.pack))
        print(f"put: {shipped.describe()}", flush=True)
        for _ in range(args.copies):
            copy_s, load_s = ray.get(copy_and_load.remote(shipped))
            print(f"copy {copy_s:.1f} s, then the pinned load {load_s:.1f} s", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
