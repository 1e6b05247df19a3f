"""Make the installed tensorrt-stubs readable by mypy: `python tools/tensorrt_stubs.py` (`make lint` runs it).

tensorrt-stubs 10.13.0.35.1 (pybind11-stubgen output) installs `tensorrt/` and `tensorrt_bindings/` as .pyi
files without a py.typed marker (so mypy skips them), and a few signatures are not valid Python: parameters
named `in`, and one required parameter after defaults (`add_scale_nd`). This writes a corrected copy to
.typing/ (git-ignored; pyproject's mypy_path), fixing only those lines, so mypy checks specpack's TensorRT
calls against TensorRT's real API. Without the stubs installed it writes nothing and mypy treats tensorrt as Any.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / ".typing"
PACKAGES = ("tensorrt", "tensorrt_bindings")
_DEF = re.compile(r"^(\s*def \w+\()(.*)(\)\s*->.*:\s*)$")


def _fix_def(line: str) -> str:
    """A one-line stub `def` that does not parse: rename `in` parameters, give later required ones `= ...`."""
    match = _DEF.match(line)
    if match is None:
        return line
    head, params, tail = match.groups()
    parts, seen_default = [], False
    for param in (p.strip() for p in params.split(", ")):
        param = re.sub(r"^in:", "in_:", param)
        if "=" in param:
            seen_default = True
        elif seen_default and ":" in param and not param.startswith("*"):
            param += " = ..."
        parts.append(param)
    return head + ", ".join(parts) + tail


def fix_source(text: str) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("def "):
            try:
                ast.parse(line.strip() + " ...")
            except SyntaxError:
                lines[i] = _fix_def(line)
    fixed = "\n".join(lines)
    ast.parse(fixed)  # the whole file parses now, or this stops with the line that does not
    return fixed


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec is not None else None
        if folder is None or not (folder / "__init__.pyi").exists():
            print(f"{package}: stubs not installed (pip install --no-deps tensorrt-stubs==10.13.0.35.1); skipped")
            continue
        for stub in folder.glob("*.pyi"):
            target = OUT / package / stub.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(fix_source(stub.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"{package}: stubs written to {OUT / package}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
