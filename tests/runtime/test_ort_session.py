"""The runtime's ONNX Runtime sessions: the default thread count follows the process's CPU affinity."""

from __future__ import annotations

import os

import pytest

from specpack.runtime.ort_session import default_threads, session_options

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                                reason="needs Linux CPU affinity and at least two CPUs")


def test_default_threads_follow_the_affinity_mask() -> None:
    """ONNX Runtime's own default is one thread per core of the machine whatever the mask (two threads spinning on
    one allowed core); the runtime's is the mask's size when that is smaller."""
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(saved)})
        assert default_threads() == 1
        assert session_options(None).intra_op_num_threads == 1
        assert session_options(3).intra_op_num_threads == 3  # an explicit count wins
        try:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        except OSError:  # a cpuset smaller than the machine: the mask cannot be widened
            return
        assert default_threads() is None
        assert session_options(None).intra_op_num_threads == 0  # 0: ONNX Runtime's default
    finally:
        os.sched_setaffinity(0, saved)
