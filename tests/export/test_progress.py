"""Phase lines of long export stages: a start line, a heartbeat while the stage runs, the time it took."""

from __future__ import annotations

import time

import pytest

from specpack.export.progress import duration, phase


def test_a_phase_says_it_started_is_alive_and_how_long_it_took() -> None:
    lines: list[str] = []
    with phase("quantizing the target (int4)", lines.append, every_s=0.05):
        time.sleep(0.3)
    assert lines[0] == "quantizing the target (int4) ..."
    assert any(line.startswith("  ... quantizing the target (int4): ") and line.endswith(" so far") for line in lines[1:-1])
    assert lines[-1].startswith("quantizing the target (int4): done in ") and lines[-1].endswith(" s")


def test_a_failing_phase_says_no_done() -> None:
    lines: list[str] = []
    with pytest.raises(RuntimeError), phase("exporting the draft", lines.append, every_s=60):
        raise RuntimeError("boom")
    assert lines == ["exporting the draft ..."]


@pytest.mark.parametrize(("seconds", "text"), [(1.234, "1.2 s"), (42.4, "42 s"), (197, "3 min 17 s"), (60, "1 min 0 s")])
def test_durations_read_as_people_write_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
