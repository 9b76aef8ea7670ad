"""`POST /v1/responses`, the OpenAI Responses API, inside the chat door's turn:

    protocol.py      the request's input items and tools as chat messages (as vLLM renders them), the
                     session it names (`prompt_cache_key`, `conversation`, the response it continues),
                     and a response's output items as the chat reply
    api_router.py    only HTTP: the route ahead of vLLM's, the request's log line and trace span
    serving.py       ResponsesService: prepare → admit → vLLM's Responses handler → settle, the cache
                     report in the response (in `response.created` when streamed)
"""
