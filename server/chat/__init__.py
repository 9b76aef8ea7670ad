"""`POST /v1/chat/completions` with the orchestrator in front of vLLM's own handler, split as vLLM's
`chat_completion/` package is:

    protocol.py      ChatRequest (vLLM's request + `context`), and ChatCall: what one request asks for,
                     built once from the validated body (the tenant's session, its scoped Context)
    api_router.py    only HTTP: the route ahead of vLLM's, the request's log line and trace span
    serving.py       ChatDoorCall: the chat door's conversions on the turn pipeline (server/pipeline/):
                     the orchestrator's messages to vLLM's chat route, the reply, the report
    stream_reply.py  ReplyAccumulator: the assistant message rebuilt from streamed chunks
"""
