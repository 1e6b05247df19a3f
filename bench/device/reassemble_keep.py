"""Join the pieces that gpu_head.py's `keep` phase wrote (and `run` calls brought back, 4 a call) into a head folder,
each file checked against the sha256 in keep.json before it is written.

    python bench/device/reassemble_keep.py DEST /work/.device/37 /work/.device/38 ...

DEST gets head.json and head.safetensors, and DEST/ckpt the corpus files (corpus.npz / .json / .key.json) where all
their pieces came back: what `spec-export --draft-head DEST` and a later `specpack distill --init DEST --data
corpus:DEST/ckpt` read. A file with a piece missing or a digest that differs is not written (exit 2, and what is
missing or wrong is said); the others are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def pieces_by_name(folders: list[Path]) -> tuple[dict[str, Path], dict[str, dict[str, int | str]]]:
    """Every piece file found (first folder wins) and the keep.json record (the same in each folder that has one)."""
    found: dict[str, Path] = {}
    record: dict[str, dict[str, int | str]] = {}
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.name == "keep.json":
                record = record or json.loads(path.read_text())
            else:
                found.setdefault(path.name, path)
    return found, record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("folders", type=Path, nargs="+", help="the folders the run calls' files came back to")
    args = parser.parse_args()
    found, record = pieces_by_name(args.folders)
    if not record:
        print("no keep.json in the folders given: bring it back with the first pieces (poll_head_run.sh does)",
              file=sys.stderr)
        return 2
    failed = False
    for name, entry in record.items():
        names = [f"{name}.{n:02d}" for n in range(int(entry["pieces"]))]
        missing = [piece for piece in names if piece not in found]
        if missing:
            print(f"{name}: pieces missing: {' '.join(missing)}", file=sys.stderr)
            failed = True
            continue
        data = b"".join(found[piece].read_bytes() for piece in names)
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"] or len(data) != entry["bytes"]:
            print(f"{name}: expected sha256 {entry['sha256']} ({entry['bytes']} bytes), found {digest} "
                  f"({len(data)} bytes): bring its pieces back again", file=sys.stderr)
            failed = True
            continue
        out = args.dest / "ckpt" / name if name.startswith("corpus") else args.dest / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        print(f"{name}: {len(data)} bytes, sha256 {digest[:12]}... ok -> {out}")
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
