"""One ONNX Runtime session over a pack graph, run through IOBinding onto caller-owned host buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from specpack.errors import SpecpackError


def session_options(threads: int | None) -> ort.SessionOptions:
    """Two sessions share the cores in turn: no spinning, so an idle one does not steal the other's time."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


class OrtGraph:
    """A session; `run` binds numpy views by pointer onto an IOBinding (no copies) and runs.

    One session serves every cache slot (ONNX Runtime's run is thread-safe); each slot runs through its own
    IOBinding (`new_binding`), which is not.
    """

    def __init__(self, path: Path, threads: int | None = None, providers: list[str] | None = None) -> None:
        try:
            self.session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                                providers=providers or ["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own exception types
            raise SpecpackError(f"ONNX Runtime could not load {path.name}", expected="a valid ONNX graph",
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
