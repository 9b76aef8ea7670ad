"""Attribute names AHC's trace spans share across packages: OpenTelemetry's semantic conventions where
one exists (session, GenAI), `ahc.*` for what only AHC knows."""

from __future__ import annotations

SESSION_ID = "session.id"
# OpenTelemetry's GenAI conventions, which Langfuse and Phoenix group and count generations by.
OPERATION_NAME = "gen_ai.operation.name"  # "chat" on every door (chat completions, Messages, Responses)
PROVIDER_NAME = "gen_ai.provider.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
REQUEST_SEED = "gen_ai.request.seed"
REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"  # only when the request asks for other than 1
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"  # the engine's, one for each choice
INPUT_TOKENS = "gen_ai.usage.input_tokens"
# The orchestrator's count of the prompt it assembled: AHC's own name, so usage is counted once (the engine's).
PROMPT_TOKENS = "ahc.prompt.tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # prompt tokens the prefix cache held
# The conversation itself, as JSON: only when the user opts in (server/telemetry/genai_messages.py).
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
# The usage names of the conventions before `input_tokens`/`output_tokens`, which vLLM's engine span has.
LEGACY_USAGE = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens")

DOOR = "ahc.door"  # the API the request came by: chat, messages, responses
TENANT = "ahc.tenant"  # the name of the tenant of the request's key (never the key)
OUTCOME = "ahc.outcome"
CONTEXT_MODE = "ahc.context.mode"  # cag | rag | passthrough
FIRST_CHANGED_BLOCK = "ahc.context.first_changed_block"
GOVERNOR_ACTIONS = "ahc.governor.actions"
