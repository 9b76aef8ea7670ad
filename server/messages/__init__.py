"""`POST /v1/messages`, the Anthropic Messages API, on the turn pipeline as a chat call:

    protocol.py      MessagesRequest (vLLM's request + `context`), and the session in Claude Code's metadata
    api_router.py    only HTTP: the route ahead of vLLM's, the request's log line and trace span
    serving.py       MessagesService: the request as vLLM's Messages handler converts it → the chat
                     door's turn → the response converted back by vLLM's handler, with the cache report
"""
