"""A GGUF file -> a plain Hugging Face model directory (fp32 safetensors, config, tokenizer), converted once.

    convert_gguf(Path("q.Q4_K_M.gguf"))  -> $SPECPACK_CACHE/converted/q.q4_k_m-<key>/
        config.json, generation_config.json, model*.safetensors (dequantized fp32),
        tokenizer.json, tokenizer_config.json, chat_template.jinja, specpack-source.json

Qwen2 and llama files are converted one tensor at a time (export/gguf_stream.py: transformers' own GGUF
steps, the same bytes, a peak of about one tensor); any other family is loaded whole by transformers (with the
`gguf` package), every weight dequantized to fp32 at load time (`GgufConfig(dequantize=True)`: with the
`kernels` package installed transformers would otherwise keep Q4_K blocks packed, and packed blocks do not
export), then saved. The cache key is the file's name, size and mtime; the
directory is written under a temporary name and renamed into place, so a failed conversion leaves nothing.
"""

from __future__ import annotations

import gc
import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpack.errors import SpecpackError
from specpack.export.gguf_stream import write_streamed
from specpack.export.gguf_tensors import load_covered
from specpack.export.progress import duration
from specpack.export.staging import remove_stale, temp_prefix
from specpack.hashing import sha256_file

if TYPE_CHECKING:
    from rich.console import Console

CONVERTER_VERSION = 1  # bump when the output of a conversion changes, so old cache entries are not reused
RECORD = "specpack-source.json"  # written last into every converted directory
TMP_BASE = ".tmp-"  # a conversion in progress: .tmp-PID-HOST-NAME (export/staging.py)
GGUF_MAGIC = b"GGUF"
# Control tokens that end generation, as llama.cpp's end-of-generation list has them; the GGUF names only one
# eos id (Qwen2.5: <|im_end|>), while the model's own generation config also stops on <|endoftext|>.
END_TOKEN_TEXTS = frozenset({"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
                             "<end_of_turn>", "<|end|>", "</s>", "<EOT>"})
_TOKENIZER_PROBE = "def f(x):\n    return x ** 2  # 平方 🙂\t<|im_start|>user\nHi 12345<|im_end|>\n"


@dataclass(frozen=True)
class GgufSummary:
    """What the header of a GGUF file says, checked against the file's size."""

    version: int
    architecture: str
    tensor_count: int
    data_end: int  # byte offset just past the last tensor's data
    file_size: int
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)  # name -> dims, innermost first (GGUF order)


def convert_gguf(gguf_path: Path, cache_dir: Path | None = None, *, console: Console | None = None) -> Path:
    """The cached plain fp32 model directory for `gguf_path`, converting it first if needed.

    `cache_dir` defaults to `$SPECPACK_CACHE/converted` (or `~/.cache/specpack/converted`).
    """
    gguf_path = Path(gguf_path).expanduser()
    _require_packages("gguf", "transformers", "accelerate", "safetensors")
    _check_is_file(gguf_path)
    root = Path(cache_dir) if cache_dir is not None else _default_converted_dir()
    out = root / cache_key(gguf_path)
    if (out / RECORD).is_file():
        return out
    summary = read_gguf_summary(gguf_path)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(root, TMP_BASE)  # what killed conversions left behind
    tmp = root / f"{temp_prefix(TMP_BASE)}{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    console = console if console is not None else _stderr_console()
    try:
        start = time.perf_counter()
        with console.status(f"converting {gguf_path.name} ({summary.architecture}) to a plain fp32 model"):
            _convert_into(gguf_path, tmp)
            record = _source_record(gguf_path, summary, time.perf_counter() - start)
            (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.print(f"converted {gguf_path.name} in {duration(time.perf_counter() - start)}", highlight=False)
        if (out / RECORD).is_file():  # another process finished first: keep its copy
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(out, ignore_errors=True)  # an incomplete leftover without a record
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _require_packages(*names: str) -> None:
    """SpecpackError naming every package that reading GGUF files needs and that is not installed."""
    import importlib.util

    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise SpecpackError("converting a GGUF file needs packages that are not installed",
                            expected=", ".join(names), found=f"missing: {', '.join(missing)}",
                            hint="pip install 'specpack[export]'")


def cache_key(gguf_path: Path) -> str:
    """"<stem>-<16 hex>" from the file's name, size and mtime and the converter version."""
    st = Path(gguf_path).stat()
    ident = f"{Path(gguf_path).name}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    stem = re.sub(r"[^a-z0-9._-]+", "-", Path(gguf_path).stem.lower()).strip("-.") or "model"
    return f"{stem[:80]}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def read_gguf_summary(path: Path) -> GgufSummary:
    """Parse the header, metadata and tensor table of a GGUF file; SpecpackError if it is not one or is cut short.

    Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata
    key/values, the tensor infos (name, n_dims, dims, ggml type, offset), padding to general.alignment, data.
    """
    path = Path(path)
    _check_is_file(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise SpecpackError(f"{path} is not a GGUF file", expected=f"the magic bytes {GGUF_MAGIC!r} at offset 0",
                                found=repr(magic) if magic else "an empty file",
                                hint="pass a .gguf model file (llama.cpp format), or a Hugging Face model directory")
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                summary = _parse_header(buf, size)
        except (struct.error, ValueError, KeyError, UnicodeDecodeError) as e:
            raise _damaged(path, f"an unreadable header ({type(e).__name__}: {e})") from e
    if summary.data_end > size:
        raise _damaged(path, f"{size:,} bytes, while its tensors end at byte {summary.data_end:,}")
    return summary


def _check_is_file(path: Path) -> None:
    if not path.is_file():
        raise SpecpackError(f"GGUF file {path} does not exist", expected="a readable .gguf file",
                            found="a directory" if path.is_dir() else "no such file", hint="check the path")


def _damaged(path: Path, found: str) -> SpecpackError:
    return SpecpackError(f"GGUF file {path} is damaged or incomplete", expected="a complete GGUF file", found=found,
                         hint="download it again (an interrupted download leaves a short file)")


def _parse_header(buf: mmap.mmap, size: int) -> GgufSummary:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}, expected 2 or 3")
    pos, meta = 24, {}
    for _ in range(n_kv):
        key, pos = _read_str(buf, pos)
        (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        value, pos = _read_value(buf, pos, vtype)
        meta[key] = value
    data_end = 0
    infos = []
    tensors: dict[str, tuple[int, ...]] = {}
    for _ in range(n_tensors):
        name, pos = _read_str(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((dims, ggml_type, offset))
        tensors[name] = tuple(dims)
    align = int(meta.get("general.alignment", 32))
    data_start = -(-pos // align) * align
    for dims, ggml_type, offset in infos:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        elements = 1
        for d in dims:
            elements *= d
        data_end = max(data_end, data_start + offset + elements // block * block_bytes)
    return GgufSummary(version, str(meta.get("general.architecture", "?")), n_tensors, data_end, size, tensors)


# GGUF metadata value types: fixed-size scalars by struct format; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read_str(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + n
    if end > len(buf):
        raise ValueError(f"a string runs past the end of the file at byte {pos}")
    return buf[pos + 8 : end].decode("utf-8"), end


def _read_value(buf: mmap.mmap, pos: int, vtype: int) -> tuple[Any, int]:
    """(value, next position); arrays are skipped over and read as None."""
    if vtype in _SCALARS:
        fmt = "<" + _SCALARS[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == 8:
        return _read_str(buf, pos)
    if vtype == 9:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _SCALARS:
            return None, pos + count * struct.calcsize("<" + _SCALARS[etype])
        for _ in range(count):
            _, pos = _read_value(buf, pos, etype)
        return None, pos
    raise ValueError(f"unknown metadata value type {vtype} at byte {pos}")


def _convert_into(gguf_path: Path, out: Path) -> None:
    """Write tokenizer, config, generation config and fp32 safetensors of `gguf_path` into `out`."""
    end_ids = _save_tokenizer(gguf_path, out)
    config = write_streamed(gguf_path, out)  # qwen2 and llama: one tensor at a time, the same bytes
    if config is not None:
        _generation_config(config, end_ids).save_pretrained(out)
    else:
        save_whole(gguf_path, out, end_ids)


def save_whole(gguf_path: Path, out: Path, end_ids: set[int]) -> None:
    """Config, generation config and fp32 safetensors of `gguf_path`, from the whole model loaded at once."""
    model = load_covered(gguf_path, _load_dequantized)  # refuses missing, extra and mis-shaped tensors
    try:
        _check_plain_fp32(model)
        model.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained while these are set
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.generation_config = _generation_config(model.config, end_ids)
        model.save_pretrained(out)
    finally:
        del model
        gc.collect()


def _generation_config(config: Any, end_ids: set[int]) -> Any:
    """A generation config whose eos ids are the config's eos first, then the other end-of-generation ids."""
    from transformers import GenerationConfig

    first = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    first = [i for i in first if i is not None]
    eos = first + sorted(end_ids - set(first))
    return GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=config.pad_token_id)


def _save_tokenizer(gguf_path: Path, out: Path) -> set[int]:
    """Save the file's tokenizer to `out`, check the saved copy encodes alike; returns its end-of-generation ids."""
    from transformers import AutoTokenizer

    tok = _from_gguf(AutoTokenizer, gguf_path)
    tok.save_pretrained(out)
    saved = AutoTokenizer.from_pretrained(out)
    if saved(_TOKENIZER_PROBE)["input_ids"] != tok(_TOKENIZER_PROBE)["input_ids"]:
        raise SpecpackError(f"the tokenizer of {gguf_path.name} does not survive saving",
                            expected="the same ids from the GGUF tokenizer and its saved copy",
                            found=f"{tok(_TOKENIZER_PROBE)['input_ids']} vs {saved(_TOKENIZER_PROBE)['input_ids']}",
                            hint="this transformers version may build this tokenizer differently; report it")
    vocab = tok.get_vocab()
    end_ids = {vocab[t] for t in END_TOKEN_TEXTS if t in vocab and t in tok.all_special_tokens}
    if tok.eos_token_id is not None:
        end_ids.add(tok.eos_token_id)
    return end_ids


def _load_dequantized(gguf_path: Path) -> Any:
    """The causal LM in `gguf_path` with every weight dequantized to fp32."""
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    return _from_gguf(AutoModelForCausalLM, gguf_path, quantization_config=GgufConfig(dequantize=True),
                      dtype=torch.float32)


def _from_gguf(cls: Any, gguf_path: Path, **kwargs: Any) -> Any:
    """`cls.from_pretrained(dir, gguf_file=...)`, with transformers' refusals turned into SpecpackError."""
    path = gguf_path.resolve()
    try:
        return cls.from_pretrained(str(path.parent), gguf_file=str(path), **kwargs)
    except (ValueError, KeyError, NotImplementedError, ImportError, OSError) as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = ("install the export extra: pip install 'specpack[export]'" if isinstance(e, ImportError)
                else "only architectures and quantization types that transformers can read from GGUF work")
        raise SpecpackError(f"transformers could not load {gguf_path.name} with {cls.__name__}",
                            expected="a GGUF causal LM that transformers supports",
                            found=f"{type(e).__name__}: {text}", hint=hint) from e


def _check_plain_fp32(model: Any) -> None:
    """Refuse a model whose weights are not plain fp32 tensors of the shapes its config implies."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(model.config)
    want = {name: tuple(p.shape) for name, p in reference.named_parameters()}
    have = {name: (tuple(p.shape), p.dtype, type(p)) for name, p in model.named_parameters()}
    bad = [f"{name}: {have[name][0] if name in have else 'missing'} {have[name][1] if name in have else ''}"
           for name, shape in want.items()
           if name not in have or have[name][:2] != (shape, torch.float32) or have[name][2] is not torch.nn.Parameter]
    bad += [f"{name}: unexpected" for name in have.keys() - want.keys()]
    if bad:
        raise SpecpackError("the GGUF weights did not load as plain fp32 tensors (packed quantized blocks?)",
                            expected="every parameter fp32, shaped as the config says",
                            found="; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""),
                            hint="uninstall the `kernels` package, or report this transformers version")


def _source_record(gguf_path: Path, summary: GgufSummary, seconds: float) -> dict[str, Any]:
    """What was converted, from what, by what: written as specpack-source.json."""
    import transformers

    st = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "name": gguf_path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256": sha256_file(gguf_path), "architecture": summary.architecture, "gguf_version": summary.version,
            "converter_version": CONVERTER_VERSION, "transformers": transformers.__version__,
            "seconds": round(seconds, 1)}


def _default_converted_dir() -> Path:
    from specpack.cache_root import cache_root

    return cache_root() / "converted"


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)
