"""The hint AHC attaches to each engine request: the request's session, and the gaps sessions leave
between one call's reply and their next call, from which the engine's side predicts when an idle session
comes back.

It rides on vLLM's `kv_hints` (an action of AHC's own type in the request's envelope), which vLLM hands
to the CPU tier's eviction policy and keeps on the scheduler's request. A hint is advisory: one missing
or malformed leaves its session ranked as unknown, which changes only which free block goes first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

ACTION_TYPE = "ahc.session_return"
ACTION_VERSION = "1"
PROTOCOL_VERSION = "1"
MAX_GAPS = 32  # the most recent gaps a hint carries: enough for the residual's shape, small on the wire


@dataclass(frozen=True)
class ReturnHint:
    """`gaps`: seconds between a reply and the session's next call, as recently seen, ascending."""

    session: str
    gaps: tuple[float, ...] = ()

    def envelope(self, message_id: str) -> KvHintsEnvelope:
        action = KvHintAction(action_id=f"{message_id}:return", action_type=ACTION_TYPE,
                              action_version=ACTION_VERSION,
                              payload={"session": self.session, "gaps": list(self.gaps)})
        return KvHintsEnvelope(protocol_version=PROTOCOL_VERSION, message_id=message_id, actions=[action])

    @classmethod
    def read(cls, envelope: KvHintsEnvelope | None) -> ReturnHint | None:
        """AHC's action in the envelope, if any and well formed."""
        if envelope is None:
            return None
        for action in envelope.actions:
            if action.action_type != ACTION_TYPE or action.action_version != ACTION_VERSION:
                continue
            session, gaps = action.payload.get("session"), action.payload.get("gaps", ())
            if not isinstance(session, str) or not isinstance(gaps, (list, tuple)):
                return None
            clean = sorted(float(g) for g in gaps if isinstance(g, (int, float)) and math.isfinite(g) and g >= 0)
            return cls(session, tuple(clean[-MAX_GAPS:]))
        return None


def expected_back_s(gaps: Sequence[float], elapsed: float) -> float | None:
    """How much longer an idle session is expected to stay away, `elapsed` seconds after its reply:
    E[G - elapsed | G > elapsed] over the gaps seen (ascending). None when no gap seen is that long:
    the session is overdue (most likely done), and expected back latest of all."""
    longer = [g for g in gaps if g > elapsed]
    if not longer:
        return None
    return sum(longer) / len(longer) - elapsed
