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
STALL_S = 60.0  # while requests decode: no text for this long fails the probe (above any prompt's prefill)
# an idle replica generates its token at most this often (236 ms of the int4 pack on the 2-core VM): Ray calls
# check_health every 2 s (ray_config.HEALTH_CHECK_PERIOD_S), and the call alone finds a dead replica
PROBE_EVERY_S = 10.0


def generate_one_token(pack: Pack) -> None:
    """One greedy token through Pack.run (the scheduler's batch when batching): raises if the pack cannot."""
    prepared = pack.prepare(GenerateRequest.of(list(PROBE_IDS), 1, temperature=0.0, limits=pack.limits))
    out = pack.run(prepared)
    if len(out.tokens) != 1:
        raise SpecpackError("the health probe got no token", expected="1 generated token",
                            found=f"{len(out.tokens)} tokens, finish_reason {out.finish_reason!r}")


async def check_pack(pack: Pack, decoder: Decoder, timeout_s: float = PROBE_TIMEOUT_S, stall_s: float = STALL_S,
                     generate: bool = True) -> bool:
    """Raise unless the replica can serve: not draining; while no request uses the pack, one token generated within
    timeout_s (in a thread: the event loop goes on serving) if `generate`; while requests decode, the pack is not
    probed (their own errors reach their clients) but it must have made progress (a job started or ended, or text
    came) within stall_s: a decode that hangs holds its worker for good, and a cancel it never reads cannot free it.
    Returns whether it generated a token."""
    if decoder.draining:
        raise SpecpackError("the replica is shutting down", expected="a serving replica", found="draining")
    if not decoder.idle:
        stalled = decoder.stalled_s
        if stalled is not None and stalled > stall_s:
            raise SpecpackError("the pack made no progress while decoding", expected=f"text within {stall_s:g} s",
                                found=f"none for {stalled:.1f} s", hint="the pack's device may be hung")
        return False
    if not generate:
        return False
    try:
        await asyncio.wait_for(asyncio.to_thread(generate_one_token, pack), timeout_s)
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        raise SpecpackError("the health probe timed out", expected=f"one token within {timeout_s:g} s",
                            found="no token yet", hint="the pack's device may be hung or overloaded") from None
    return True
