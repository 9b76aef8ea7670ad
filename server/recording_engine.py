"""The engine client vLLM's OpenAI layer talks to: AsyncLLM, with every generated token recorded.

One interception point covers chat, completions, streaming and not: `generate`. The request's session
comes from the chat route (`current_record`); requests without one get a session of their own.
"""

from __future__ import annotations

from typing import Any, AsyncGenerator

from orchestrator.orchestrator import new_session_id
from server.recorder import Recorder, TokenStream
from server.request_context import current_record


class RecordingEngine:
    def __init__(self, engine: Any, recorder: Recorder) -> None:
        self._engine = engine
        self._recorder = recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any,
                 **kwargs: Any) -> AsyncGenerator[Any, None]:
        # Read the request's record now, in the caller's context, not when iteration starts.
        record = current_record.get()
        xdb_session = record.session_id if record is not None else new_session_id()
        return self._generate(xdb_session, (prompt, sampling_params, request_id, *args), kwargs)

    async def _generate(self, xdb_session: str, args: tuple, kwargs: dict[str, Any]) -> AsyncGenerator[Any, None]:
        from vllm.sampling_params import RequestOutputKind

        _, sampling_params, request_id = args[:3]
        delta = getattr(sampling_params, "output_kind", None) == RequestOutputKind.DELTA
        n = getattr(sampling_params, "n", 1) or 1
        streams: dict[int, TokenStream] = {}
        seen: dict[int, int] = {}
        finished = False
        try:
            async for output in self._engine.generate(*args, **kwargs):
                for completion in output.outputs:
                    stream = streams.get(completion.index)
                    if stream is None:
                        stream = streams[completion.index] = self._recorder.token_stream(
                            xdb_session, request_id, n, completion.index)
                    ids = list(completion.token_ids)
                    new = ids if delta else ids[seen.get(completion.index, 0):]
                    seen[completion.index] = seen.get(completion.index, 0) + len(new)
                    stream.add(new)
                if output.finished:
                    finished = True
                    for stream in streams.values():  # activations still in flight, bounded wait
                        await stream.finish()
                    # A completed reply is durable before the client sees it complete (kill -9 safe);
                    # the tokens themselves were never held up by the disk.
                    await self._recorder.aflush()
                yield output
        finally:
            if not finished:  # aborted: tokens held for their activations are written anyway
                for stream in streams.values():
                    stream.close()
