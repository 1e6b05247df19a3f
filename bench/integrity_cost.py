"""What the pack integrity check costs on a real pack: the full sha256 pass, the stamp-keyed fast path, and
parsing + validating the manifest. Nothing is written into the pack (the stamp is not updated).

    python bench/integrity_cost.py PACK [--rounds 2] [--out bench/results/integrity_cost.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from specpack.bench.report import cpu_model
from specpack.contract.integrity import resolve_files, stamp_key
from specpack.contract.manifest import Manifest
from specpack.hashing import sha256_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/integrity_cost.json"))
    args = parser.parse_args()

    read_s = []
    for _ in range(5):
        start = time.perf_counter()
        manifest = Manifest.read(args.pack)
        read_s.append(time.perf_counter() - start)
    total = sum(f.size for f in manifest.files)
    full_s = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        paths = resolve_files(args.pack, manifest)
        bad = [f.path for f in manifest.files if sha256_file(paths[f.path]) != f.sha256]
        full_s.append(time.perf_counter() - start)
        assert not bad, bad
    fast_s = []
    for _ in range(20):
        start = time.perf_counter()
        paths = resolve_files(args.pack, manifest)
        keys = [stamp_key(paths[f.path], f) for f in manifest.files]
        fast_s.append(time.perf_counter() - start)
    result = {
        "pack": str(args.pack), "files": len(manifest.files), "bytes": total,
        "manifest_bytes": (args.pack / "manifest.json").stat().st_size, "machine": cpu_model(),
        "manifest_read_ms_median": round(statistics.median(read_s) * 1e3, 2),
        "full_check_s": [round(s, 2) for s in full_s],
        "full_check_mb_per_s": [round(total / 1e6 / s) for s in full_s],
        "fast_path_ms_median": round(statistics.median(fast_s) * 1e3, 3), "keys_checked": len(keys),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
