"""Attribute names AHC's trace spans share across packages: OpenTelemetry's semantic conventions where
one exists (session, GenAI usage), `ahc.*` for what only AHC knows."""

from __future__ import annotations

SESSION_ID = "session.id"
# OpenTelemetry's GenAI conventions, which Langfuse and Phoenix group generations by.
OPERATION_NAME = "gen_ai.operation.name"  # "chat" on every chat door (chat completions, Messages)
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
CONVERSATION_ID = "gen_ai.conversation.id"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # prompt tokens the prefix cache held
CONTEXT_MODE = "ahc.context.mode"  # cag | rag | passthrough
FIRST_CHANGED_BLOCK = "ahc.context.first_changed_block"
GOVERNOR_ACTIONS = "ahc.governor.actions"
