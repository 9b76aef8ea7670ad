"""The chat request as AHC takes it, and what one request asks for once it is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator
from starlette.datastructures import Headers
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from core.errors import InvalidRequest
from core.limits import ID_MAX_CHARS, MESSAGE_MAX_CHARS
from orchestrator.context_spec import ContextSpec
from orchestrator.memory_tools import MEMORY_TOOLS
from orchestrator.turn_request import TurnRequest
from orchestrator.turn_retry import Retry
from server.admission.turn_admission import Asked
from server.http.retry_headers import request_retry
from server.http.session_key import HEADER, SessionKey, session_key, unicode_id
from server.tenancy.tenants import Tenant


class ChatRequest(ChatCompletionRequest):
    """vLLM's chat request with AHC's `context` (sent by the `openai` client in `extra_body`)."""

    context: ContextSpec | None = None
    # OpenAI's key for requests that share a prefix: here it names the session (server/http/session_key.py).
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=ID_MAX_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _structured_outputs_is_an_object(cls, data: Any) -> Any:
        """vLLM's own check of `structured_outputs` reads it as an object and fails (a 500) on anything
        else: a string, a list or a number is a 400 here, before it."""
        if isinstance(data, dict) and data.get("structured_outputs") is not None \
                and not isinstance(data["structured_outputs"], dict):
            raise ValueError("structured_outputs must be an object (json, regex, choice, grammar, ...) or null")
        return data

    @model_validator(mode="before")
    @classmethod
    def _memory_tools_are_tools(cls, data: Any) -> Any:
        """The memory verbs `context.memory_tools` names are tools of the request (the orchestrator offers
        them; orchestrator/memory_tools.py): vLLM's checks of `tool_choice` see them, so a client may name
        one. A copy: the body as sent stays the client's."""
        context = data.get("context") if isinstance(data, dict) else None
        names = context.get("memory_tools") if isinstance(context, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) and n in MEMORY_TOOLS for n in names):
            return data  # none, or a bad one: `context`'s own validation names it
        tools = data.get("tools") if isinstance(data.get("tools"), list) else []
        have = {t.get("function", {}).get("name") for t in tools if isinstance(t, dict)}
        return {**data, "tools": [*tools, *(MEMORY_TOOLS[n] for n in names if n not in have)]}

    # A client's `request_id` names the request's rows in XDB ("chatcmpl-" and it): UTF-8 must hold it.
    _request_id = field_validator("request_id")(unicode_id)

    @field_validator("messages")
    @classmethod
    def _message_sizes(cls, messages: list[Any]) -> list[Any]:
        if (oversized := oversized_message(messages)) is not None:
            raise ValueError(oversized[1])
        return messages

    @classmethod
    def of(cls, converted: ChatCompletionRequest, **ahc: Any) -> ChatRequest:
        """A chat request vLLM has made and validated (another door's, converted), with AHC's fields: not
        validated again, but for the messages' sizes."""
        if (oversized := oversized_message(converted.messages)) is not None:
            raise InvalidRequest(oversized[1], param=f"messages.{oversized[0]}.content")
        fields = {name: getattr(converted, name) for name in type(converted).model_fields}
        given = {name: value for name, value in ahc.items() if value is not None}
        return cls.model_construct(_fields_set=converted.model_fields_set | given.keys(), **fields, **given)


def oversized_message(messages: list[Any]) -> tuple[int, str] | None:
    """The first message whose text is over MESSAGE_MAX_CHARS (core/limits.py), and why: a message
    may be a pasted document, but not the whole body's worth of one."""
    for i, message in enumerate(messages):
        chars = _content_chars(message.get("content") if isinstance(message, dict) else None)
        if chars > MESSAGE_MAX_CHARS:
            return i, f"messages.{i}.content is {chars:,} characters, over the limit of {MESSAGE_MAX_CHARS:,}"
    return None


def _content_chars(content: Any) -> int:
    """A message content's characters: a string, or the text of its parts."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


@dataclass(frozen=True)
class ChatCall:
    """One chat request, read once: the validated request, the body as the client sent it (the
    orchestrator keeps the client's messages and tools byte for byte, which vLLM's typed messages do
    not), the calling tenant, the session it names (the `context`'s, scoped to the tenant), and what it
    asks to generate (admission's and the orchestrator's budget, from the validated request)."""

    request: ChatRequest
    body: dict[str, Any]
    tenant: Tenant
    key: SessionKey
    spec: ContextSpec | None  # with its session id scoped to the tenant; None: no `context`
    asked: Asked
    retry: Retry  # how the request says it is sent again

    @classmethod
    def read(cls, request: ChatRequest, body: dict[str, Any], headers: Headers, tenant: Tenant,
             cache_param: str = "prompt_cache_key") -> ChatCall:
        """`cache_param`: where the request's `prompt_cache_key` came from (another API's field for it)."""
        key = session_key(request.context.session_id if request.context else None, headers.get(HEADER),
                          request.prompt_cache_key, cache_param)
        spec = request.context
        if spec is not None and spec.session_id is not None:  # the tenant's own session of that name
            spec = spec.model_copy(update={"session_id": tenant.scope(spec.session_id)})
        asked = Asked.of(request.max_completion_tokens or request.max_tokens, request.n)
        return cls(request, body, tenant, key, spec, asked, request_retry(headers))

    @property
    def label(self) -> str | None:
        """The stored id an ordinary client's turns are labelled with (a header or `prompt_cache_key`
        session, whose State the client keeps); None when the server keeps it or none is named."""
        if self.key.session_id is None or self.key.keeps_state:
            return None
        return self.tenant.scope(self.key.session_id)

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    @property
    def tools(self) -> list[dict[str, Any]]:
        return list(self.body.get("tools") or ())

    def turn_request(self, spec: ContextSpec | None) -> TurnRequest:
        """What the orchestrator gets: the `context` with its documents resolved, and the rest as read here."""
        return TurnRequest(spec, self.messages, self.asked.completion_tokens, tuple(self.tools), self.tenant.prefix,
                           self.label, retry=self.retry)
