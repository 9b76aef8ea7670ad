"""Size caps on the free-text fields of request bodies, in characters, in one place.

Every request body is already under `max_request_bytes` (server/http/body_limit.py); these caps stop a
single field from taking all of it where a long value has no use and costs something: a prompt block
that is tokenized and hashed on every request, a row stored in XDB forever, a tag name repeated in
every recall. A value over its cap is a 400 naming the field. The Codex has its own, configurable
limits (`orchestrator.rag_max_*`, orchestrator/retrieval/limits.py, 413), as have XDB documents
(`xdb.max_document_bytes`).
"""

from __future__ import annotations

ID_MAX_CHARS = 256                # session, Codex document and karma entry ids

# The chat request's context (orchestrator/context_spec.py) and messages (server/chat/protocol.py).
IDENTITY_MAX_CHARS = 200_000      # a system prompt; ~50k tokens, more than any window we serve leaves for it
KARMA_TEXT_MAX_CHARS = 20_000     # one fact or lesson; each is kept word for word in every prompt
KARMA_MAX_ENTRIES = 10_000
MESSAGE_MAX_CHARS = 2_000_000     # one message's text: as long as a Codex document may be (rag_max_document_chars)

# XDB routes (server/routes/xdb_routes.py).
COMMENT_MAX_CHARS = 65_536        # a comment on a timestep or range
TAG_MAX_CHARS = 256               # a tag's name, also each tag of a document
NOTE_MAX_CHARS = 4_096            # a tag's note and description, a pin's reason
DOCUMENT_NAME_MAX_CHARS = 512
DOCUMENT_SUMMARY_MAX_CHARS = 65_536  # also a compaction's summary
DOCUMENT_MAX_TAGS = 256
