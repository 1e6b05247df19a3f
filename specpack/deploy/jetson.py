"""`specpack deploy jetson`: a self-contained folder that carries a pack to a Jetson and builds its engines there.

    BUNDLE/
      README.md                  what is here, and the three commands to run on the device
      build_engines.sh           1. every bundle file against SHA256SUMS   2. the device: aarch64, Python, TensorRT 10
                                 3. a venv (system site packages: JetPack's TensorRT) with the pinned requirements
                                 4. `specpack verify pack --manifest-sha256 H`   5. `specpack build pack --backend tensorrt`
                                 (--dry-run: step 1, then the commands printed, nothing installed or built)
      requirements-aarch64.txt   the runtime's requirements, pinned, for JetPack 6 (CPython 3.10, aarch64)
      bundle.json                what was bundled: the pack's manifest sha256, JetPack, precision, specpack version
      SHA256SUMS                 sha256 of every other file of the bundle (sha256sum -c format)
      pack/                      the pack without engines: manifest.json, graphs (+ external data), tokenizer
      lib/specpack/              specpack's sources (on the venv's path, a .pth file): the runtime, `verify`, `build`

Engines are never carried: a TensorRT plan runs only on the GPU and TensorRT version it was built on, so the
bundle's manifest lists none and the device builds its own. Written into a staging folder, renamed into place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from specpack import __version__
from specpack.contract.engines import check_buildable, write_manifest_atomic
from specpack.contract.manifest import MANIFEST_FILE, Manifest, manifest_sha256, schema_error
from specpack.deploy.bundle_files import PACK_DIR, RECORD, SUMS, bundle_refusal, remove_bundle
from specpack.errors import SpecpackError
from specpack.export.staging import check_writable
from specpack.hashing import sha256_file

LIB_DIR, SCRIPT = "lib", "build_engines.sh"
REQUIREMENTS = "requirements-aarch64.txt"


@dataclass(frozen=True)
class JetPack:
    version: str
    tensorrt_major: int
    cuda: str
    python: str


JETPACKS = {6: JetPack(version="6.1+ (L4T r36.4)", tensorrt_major=10, cuda="12.6", python="3.10")}

# specpack's runtime requirements resolved for CPython 3.10 on manylinux aarch64 (JetPack 6: Ubuntu 22.04, glibc 2.35):
#   pip install --dry-run --report R --platform manylinux_2_28_aarch64 ... --python-version 3.10 --only-binary=:all:
# onnxruntime 1.23.2 is the newest release with a cp310 aarch64 wheel; numpy 1.x for JetPack's TensorRT bindings.
REQUIREMENTS_JETPACK6 = """\
numpy==1.26.4
onnxruntime==1.23.2
tokenizers==0.23.3
jinja2==3.1.6
click==8.5.1
rich==15.0.0
pydantic==2.14.4
pydantic-core==2.50.5
annotated-types==0.8.0
typing-extensions==4.16.0
typing-inspection==0.4.5
markupsafe==3.0.4
markdown-it-py==4.3.0
mdurl==0.1.2
pygments==2.21.0
huggingface-hub==2.4.0
hf-xet==1.8.0
httpx2==2.14.0
httpcore2==2.14.0
h11==0.16.0
anyio==4.16.0
idna==3.20
filelock==4.1.0
fsspec==2026.9.0
packaging==26.4
pyyaml==6.0.4
tqdm==4.70.1
truststore==0.10.5
coloredlogs==15.0.1
humanfriendly==10.0
flatbuffers==25.12.19
protobuf==7.36.2
sympy==1.14.0
mpmath==1.3.0
"""


@dataclass(frozen=True)
class JetsonOptions:
    jetpack: int = 6
    precision: str = "fp16"   # what build_engines.sh passes to `specpack build` (Orin: no FP8)
    workspace_gb: int = 2     # Orin shares its memory with the CPU: keep the builder's share small

    def __post_init__(self) -> None:
        if self.jetpack not in JETPACKS:
            raise SpecpackError("unsupported --jetpack", expected=" | ".join(map(str, JETPACKS)), found=repr(self.jetpack))
        if self.precision not in ("fp16", "int8"):
            raise SpecpackError("invalid --precision for a Jetson", expected="fp16 | int8 (Orin has no FP8)",
                                found=repr(self.precision))


def write_bundle(pack: Path, out: Path, options: JetsonOptions, *, overwrite: bool = False) -> Path:
    """Check the pack (files, form), then write the bundle at `out` (staged, renamed into place)."""
    from specpack.contract.integrity import verify_pack
    from specpack.export.staging import publish, staging_dir

    pack, out = Path(pack), Path(out)
    _check_out(out, overwrite)  # before any work
    manifest = Manifest.read(pack)
    verify_pack(pack, manifest, full=True)  # a bundle carries only what matches its manifest
    check_buildable(manifest)
    with staging_dir(out) as staging:
        digest = _copy_pack(pack, manifest, staging / PACK_DIR)
        _copy_sources(staging / LIB_DIR)
        jp = JETPACKS[options.jetpack]
        (staging / REQUIREMENTS).write_text(REQUIREMENTS_JETPACK6)
        record = {"specpack_version": __version__, "jetpack": options.jetpack, "tensorrt_major": jp.tensorrt_major,
                  "python": jp.python, "precision": options.precision, "workspace_gb": options.workspace_gb,
                  "manifest_sha256": digest}
        (staging / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        script = staging / SCRIPT
        script.write_text(build_script(digest, options, jp))
        script.chmod(0o755)
        (staging / "README.md").write_text(readme(digest, options, jp))
        (staging / SUMS).write_text(sha256sums(staging))
        if out.exists() or out.is_symlink():
            _check_out(out, overwrite)  # again: it may have changed while the bundle was written
            remove_bundle(out)  # only the files it lists: never a tree
        publish(staging, out, overwrite=False)
    return out


def _check_out(out: Path, overwrite: bool) -> None:
    """A new path, or with --overwrite a bundle holding only the files deploy jetson wrote (deploy/bundle_files.py)."""
    check_writable(out)
    if not out.exists() and not out.is_symlink():
        return
    refusal = bundle_refusal(out)
    if not overwrite or refusal is not None:
        raise SpecpackError(f"{out} already exists", expected="a new folder (or a bundle, with --overwrite)",
                            found="an existing bundle" if refusal is None else f"an existing path that is not a "
                                  f"bundle of deploy jetson's alone: {refusal}",
                            hint="choose another -o" + (", or pass --overwrite" if refusal is None else
                                                        ", or move your files away yourself"))


def _copy_pack(pack: Path, manifest: Manifest, dest: Path) -> str:
    """The pack's listed files except engines, and its manifest without engines; returns that manifest's sha256."""
    engines = {e.path for e in manifest.engines}
    dest.mkdir()
    for entry in manifest.files:
        if entry.path not in engines:
            (dest / entry.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pack / entry.path, dest / entry.path)
    if engines:
        data = manifest.model_dump(mode="json", by_alias=True)
        data.update(engines=[], files=[f for f in data["files"] if f["path"] not in engines],
                    backends=[b for b in manifest.backends if b != "tensorrt"] or ["onnxruntime"])
        try:
            stripped = Manifest.model_validate(data)
        except ValidationError as err:
            raise schema_error(err, "the pack's manifest without its engines is not a valid manifest") from None
        write_manifest_atomic(dest, stripped)
    else:
        shutil.copyfile(pack / MANIFEST_FILE, dest / MANIFEST_FILE)
    return manifest_sha256(dest)


def _copy_sources(dest: Path) -> None:
    """This specpack's own package (the runtime, verify and build run from it on the device)."""
    source = Path(__file__).resolve().parent.parent
    shutil.copytree(source, dest / "specpack", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def sha256sums(folder: Path) -> str:
    """`sha256sum -c` lines for every file under `folder` but SHA256SUMS itself, sorted by path."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != SUMS)
    return "".join(f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}\n" for p in files)


def build_script(digest: str, options: JetsonOptions, jp: JetPack) -> str:
    verify = f"python -m specpack verify {PACK_DIR} --manifest-sha256 {digest}"
    build = (f"python -m specpack build {PACK_DIR} --backend tensorrt --precision {options.precision} "
             f"--workspace-gb {options.workspace_gb}")
    return f"""#!/usr/bin/env bash
# Build this pack's TensorRT engines on a Jetson (JetPack {jp.version}: TensorRT {jp.tensorrt_major}, CUDA {jp.cuda},
# Python {jp.python}). Written by specpack {__version__} (`specpack deploy jetson`).
#   bash {SCRIPT}            check, install into ./.venv, verify the pack, build the engines into {PACK_DIR}/engines/
#   bash {SCRIPT} --dry-run  check the bundle's files, then print the commands without running them
set -euo pipefail
cd "$(dirname "$0")"
DRY_RUN=0
[ "${{1:-}}" = "--dry-run" ] && DRY_RUN=1
PYTHON="${{PYTHON:-python3}}"
VENV=.venv

run() {{  # print a command, quoted to paste; run it unless --dry-run
  printf '+'; printf ' %q' "$@"; printf '\\n'
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}}

echo "1. bundle files against {SUMS}"
sha256sum --quiet --strict -c {SUMS}
echo "   ok"

echo "2. the device"
if [ "$DRY_RUN" = 0 ]; then
  [ "$(uname -m)" = aarch64 ] || {{ echo "error: expected an aarch64 Jetson, found $(uname -m)" >&2; exit 2; }}
  "$PYTHON" -c 'import sys; assert sys.version_info[:2] == ({jp.python.replace(".", ", ")}), sys.version' \\
    || {{ echo "error: expected Python {jp.python} (JetPack {options.jetpack})" >&2; exit 2; }}
  "$PYTHON" -c 'import tensorrt; assert int(tensorrt.__version__.split(".")[0]) == {jp.tensorrt_major}, tensorrt.__version__' \\
    || {{ echo "error: expected TensorRT {jp.tensorrt_major} in $PYTHON (JetPack {jp.version}: python3-libnvinfer)" >&2
         exit 2; }}
  echo "   ok: aarch64, Python {jp.python}, TensorRT {jp.tensorrt_major}"
else
  echo "   (dry run: aarch64, Python {jp.python} and TensorRT {jp.tensorrt_major} are checked on the device)"
fi

echo "3. a virtual environment with the pinned requirements (JetPack's TensorRT through system site packages)"
run "$PYTHON" -m venv --system-site-packages "$VENV"
run "$VENV/bin/python" -m pip install --no-deps -r {REQUIREMENTS}  # every package pinned: nothing else resolves
# {LIB_DIR}/ on the venv's path through a .pth file: a search path variable would split a folder name at ':'
LIB="$PWD/{LIB_DIR}"
case "$LIB" in *$'\\n'*) echo "error: the bundle's path holds a newline: move the bundle" >&2; exit 2;; esac
if [ "$DRY_RUN" = 0 ]; then
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf '%s\\n' "$LIB" > "$SITE/specpack-bundle.pth"
fi
echo "+ (the venv's site-packages)/specpack-bundle.pth: $(printf '%q' "$LIB")"
PY="$VENV/bin/python"

echo "4. the pack against its manifest (pinned to sha256 {digest[:16]}...)"
run "$PY" -m {verify.removeprefix("python -m ")}

echo "5. engines for this GPU"
run "$PY" -m {build.removeprefix("python -m ")}

echo "done. Generate with:"
printf '  %q -m specpack generate %q --device tensorrt --prompt %q\\n' "$PWD/$PY" "$PWD/{PACK_DIR}" 'def fib(n):'
"""


def readme(digest: str, options: JetsonOptions, jp: JetPack) -> str:
    return f"""# specpack bundle for a Jetson

A speculative-decoding pack (draft + target ONNX graphs, tokenizer, manifest) and what a Jetson needs to build
its TensorRT engines on the device. Made by specpack {__version__} for JetPack {jp.version}: TensorRT
{jp.tensorrt_major}, CUDA {jp.cuda}, Python {jp.python}, aarch64 (Jetson Orin).

On the Jetson:

```bash
bash {SCRIPT} --dry-run   # check every file of the bundle, print what would run
bash {SCRIPT}             # check, install the pinned requirements into ./.venv, verify the pack, build engines
.venv/bin/python -m specpack generate {PACK_DIR} --device tensorrt --prompt "def fib(n):"
```

- `{PACK_DIR}/` is the pack without engines: plans run only on the GPU and TensorRT version they were built
  with, so they are built here ({options.precision}, {options.workspace_gb} GiB builder workspace) into
  `{PACK_DIR}/engines/<gpu>-sm<cc>-trt<version>/` and listed in its manifest with their sha256.
- The pack's manifest sha256 is `{digest}`: `{SCRIPT}` refuses any other (`specpack verify --manifest-sha256`).
- `{SUMS}` lists every other file of the bundle; `{REQUIREMENTS}` pins the runtime's Python packages
  (aarch64 wheels from PyPI); TensorRT itself comes from JetPack (`python3-libnvinfer`), reached through the
  virtual environment's system site packages. `{LIB_DIR}/specpack` is specpack's source, on the virtual
  environment's path through a `.pth` file that `{SCRIPT}` writes.
- Never run on a Jetson by specpack's authors: the bundle's layout and this script's dry run are tested; the
  build and the TensorRT backend are written to TensorRT's documented API (docs/tensorrt.md in specpack).
"""
