"""Loading a pack and generating needs neither torch, transformers nor onnx (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys


def test_generate_without_heavy_imports(tiny_pack) -> None:
    pack_dir = tiny_pack("qwen2", "noisy")[0]
    code = (
        "import sys, specpack; pack = specpack.load(sys.argv[1]); out = pack.generate('def add(a, b):', 8, k=4); "
        "assert len(out.tokens) >= 1; "
        "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code, str(pack_dir)], check=True)
