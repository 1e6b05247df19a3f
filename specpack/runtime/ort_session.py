"""One ONNX Runtime session over a pack graph, run through IOBinding onto caller-owned host buffers.

Threads. The draft and the target run in turn, never at once, each on its own intra-op pool. A pool's threads
spin while a run is in progress (hundreds of small ops a step: a sleeping pool pays a wake-up for each) and
stop spinning the moment the run returns (`session.force_spinning_stop`), so an idle session never takes the
cores from the one running. Measured on the real Q4_K_M pair, 2-core AMD EPYC, 2 threads (bench/README.md,
"Threads that spin within a run"; medians of 6 rounds): against pools that never spin, a draft step
26.9 -> 22.9 ms, a target step 87.3 -> 78.0 ms, a speculative step (4 draft steps and a verify) 291 -> 256 ms.
ONNX Runtime's process-wide shared pool gives about the same, but once it exists every other session in the
process must use it too (creating one with threads of its own fails), so the runtime does not impose it.

Thread count. ONNX Runtime's default pool has one thread per physical core of the machine, whatever the
process's CPU affinity: under `taskset -c 0` or a container's cpuset of one core, its two threads would spin
on that one core. So when the affinity mask holds fewer CPUs than the machine, the default is the mask's size.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from specpack.errors import SpecpackError

if TYPE_CHECKING:
    from specpack.contract.verified_read import GraphBytes

EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


def default_threads() -> int | None:
    """The CPUs this process may run on, where that is fewer than the machine has; None: ONNX Runtime's default."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None
    return allowed if allowed < (os.cpu_count() or allowed) else None


def session_options(threads: int | None, spin: bool = True) -> ort.SessionOptions:
    """Two sessions share the cores in turn: spinning within a run only (see the module docstring); spin False:
    never (bench/thread_spin.py's baseline). threads None: default_threads()."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = threads or default_threads()
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.log_severity_level = 3
    return opts


def open_session(source: Path | GraphBytes, opts: ort.SessionOptions, providers: Sequence[Any]) -> ort.InferenceSession:
    """A session over a graph's path, or over verified bytes: the graph's, and each external data file's under the
    name the graph gives it. With bytes, ONNX Runtime reads nothing from disk: the external data folder is an
    empty directory of our own, so a location the bytes do not cover fails instead of being read from the working
    directory (where ONNX Runtime looks for a graph given as bytes)."""
    if isinstance(source, Path):
        return ort.InferenceSession(str(source), sess_options=opts, providers=providers)
    names = list(source.external)
    if names:
        opts.add_external_initializers_from_files_in_memory(names, [source.external[n] for n in names],
                                                            [len(source.external[n]) for n in names])
    with tempfile.TemporaryDirectory(prefix="specpack-nodata-") as empty:
        opts.add_session_config_entry(EXTERNAL_DATA_FOLDER, empty)
        return ort.InferenceSession(source.model, sess_options=opts, providers=providers)


class OrtGraph:
    """A session; `run` binds numpy views by pointer onto an IOBinding (no copies) and runs.

    One session serves every cache slot (ONNX Runtime's run is thread-safe); each slot runs through its own
    IOBinding (`new_binding`), which is not.
    """

    def __init__(self, source: Path | GraphBytes, threads: int | None = None, providers: list[str] | None = None) -> None:
        """source: the graph's path (ONNX Runtime reads it and its external data), or its verified bytes."""
        name = source.name if isinstance(source, Path) else Path(source.name).name
        try:
            self.session = open_session(source, session_options(threads), providers or ["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own exception types
            raise SpecpackError(f"ONNX Runtime could not load {name}", expected="a valid ONNX graph",
                                found=str(err).splitlines()[0], hint="run `specpack verify PACK`") from err
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.output_names = {o.name for o in self.session.get_outputs()}
        self._bindings: list[ort.IOBinding] = []

    def new_binding(self) -> ort.IOBinding:
        binding = self.session.io_binding()
        self._bindings.append(binding)
        return binding

    def run(self, binding: ort.IOBinding, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        for name, array in inputs.items():
            binding.bind_input(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        for name, array in outputs.items():
            binding.bind_output(name, "cpu", 0, array.dtype.type, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(binding)

    def close(self) -> None:
        for binding in self._bindings:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
