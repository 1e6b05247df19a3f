"""A replica's health probe: can the pack still generate one token? (Ray Serve's check_health, ray_app.py)"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from specpack.errors import SpecpackError
from specpack.runtime.request import GenerateRequest

if TYPE_CHECKING:
    from specpack.runtime.pack import Pack
    from specpack.serve.decoder import Decoder

PROBE_IDS = (0,)        # one token id, in every vocabulary; the probe's text is never shown
PROBE_TIMEOUT_S = 20.0  # under Ray Serve's health_check_timeout_s (30 s by default)


def generate_one_token(pack: Pack) -> None:
    """One greedy token through Pack.run (the scheduler's batch when batching): raises if the pack cannot."""
    prepared = pack.prepare(GenerateRequest.of(list(PROBE_IDS), 1, temperature=0.0, limits=pack.limits))
    out = pack.run(prepared)
    if len(out.tokens) != 1:
        raise SpecpackError("the health probe got no token", expected="1 generated token",
                            found=f"{len(out.tokens)} tokens, finish_reason {out.finish_reason!r}")


async def check_pack(pack: Pack, decoder: Decoder, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise unless the replica can serve: not draining, and, while no request uses the pack, one token generated
    within timeout_s (in a thread: the event loop goes on serving). While requests decode the pack is not probed:
    their own errors reach their clients (what remains: a progress watchdog for a decode that hangs)."""
    if decoder.draining:
        raise SpecpackError("the replica is shutting down", expected="a serving replica", found="draining")
    if not decoder.idle:
        return
    try:
        await asyncio.wait_for(asyncio.to_thread(generate_one_token, pack), timeout_s)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise SpecpackError("the health probe timed out", expected=f"one token within {timeout_s:g} s",
                            found="no token yet", hint="the pack's device may be hung or overloaded") from None
