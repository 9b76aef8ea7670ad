"""Admission: whether a request may go to the engine now, decided in one place, before vLLM sees it.

The data flows one way: the engine's figures (KV blocks free and in all, the bytes a block takes, the
measured prefill rate) are read by `server/metrics.py` into `KVStats` and `PrefillCost`; the policies
here read those and decide; the chat route, the completions route and the hidden calls ask them.

    kv_geometry.py        the KV bytes per token and per block of the served model, from vLLM's config
    prefill_cost.py       PrefillCost: seconds a prefilled block costs, measured on the engine's own steps
    vram_governor.py      VramGovernor: reserve a request's new KV blocks, or wait, compact, refuse (429)
    session_admission.py  SessionAdmission: many sessions on one cache: when re-prefill would drown the
                          engine, sessions in flight keep the cache in their order in line; otherwise a
                          cold turn waits for a hot one only while that costs less than the prefill it spares
    turn_admission.py     admitting a chat turn (session admission, then the governor) and the
                          recording back-pressure every generating route waits on
    recording_gate.py     RecordingGate: that back-pressure on every vLLM route that can generate
                          (completions, Responses, Messages, ...), before the request's body is read
    hidden.py             HiddenAdmission: the server's own calls (condensed renditions) admitted like
                          requests, one at a time per model, within a tenant's hourly budget

Nothing here imports the metrics or the routes: `server/runtime.py` builds the policies from them.
"""
