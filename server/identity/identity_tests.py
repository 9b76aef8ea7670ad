"""The tests a condensed Identity must pass: a user message and what its answer must satisfy.

An answer passes when it holds the expected substring, matches the regular expression (searched, not
anchored) and, with a JSON schema, is a JSON value the schema accepts; each test names at least one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from jsonschema import exceptions as schema_errors
from jsonschema import validators

FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


@dataclass(frozen=True)
class IdentityTest:
    input: str
    contains: str | None = None
    pattern: str | None = None
    json_schema: dict[str, Any] | None = None
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """A test that expects nothing, a pattern that does not compile or a schema that is no schema: ValueError."""
        if not self.input.strip():
            raise ValueError("a test's input must not be empty")
        if self.contains is None and self.pattern is None and self.json_schema is None:
            raise ValueError("a test needs at least one of contains, pattern or json_schema")
        if self.contains == "":
            raise ValueError("a test's contains must not be empty")
        if self.pattern is not None:
            try:
                object.__setattr__(self, "_regex", re.compile(self.pattern))
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r} is no regular expression: {exc}") from None
        if self.json_schema is not None:
            try:
                validators.validator_for(self.json_schema).check_schema(self.json_schema)
            except schema_errors.SchemaError as exc:
                raise ValueError(f"json_schema is no JSON schema: {exc.message}") from None

    def failures(self, answer: str) -> list[str]:
        """Why the answer fails this test (empty: it passes)."""
        found: list[str] = []
        if self.contains is not None and self.contains not in answer:
            found.append(f"does not contain {self.contains!r}")
        if self._regex is not None and self._regex.search(answer) is None:
            found.append(f"does not match {self.pattern!r}")
        if self.json_schema is not None:
            found.extend(_schema_failures(self.json_schema, answer))
        return found

    def expected(self) -> dict[str, Any]:
        """What the test asks of an answer, as the caller gave it."""
        return {k: v for k, v in (("contains", self.contains), ("pattern", self.pattern),
                                  ("json_schema", self.json_schema)) if v is not None}


def _schema_failures(schema: dict[str, Any], answer: str) -> list[str]:
    text = answer.strip()
    fenced = FENCE.fullmatch(text)  # models often wrap JSON in a Markdown code block
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return ["is not JSON"]
    error = validators.validator_for(schema)(schema).iter_errors(value)
    return [f"does not match the JSON schema: {e.message}" for e in error][:3]
