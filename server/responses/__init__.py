"""`POST /v1/responses`, the OpenAI Responses API, on the turn pipeline (server/pipeline/):

    protocol.py      the request's input items and tools as chat messages (as vLLM renders them), the
                     session it names (`prompt_cache_key`, `conversation`, the response it continues),
                     and a response's output items as the chat reply
    api_router.py    only HTTP: the route ahead of vLLM's, the request's log line and trace span
    serving.py       ResponsesDoorCall: the door's conversions (vLLM's Responses route on the prepared
                     prompt, the reply from the output items, the cache report in the response, in
                     `response.created` when streamed); ResponsesService: stored responses read, deleted
"""
