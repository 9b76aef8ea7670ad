"""A scripted coding agent's session: its tools, the results its fake tools return and the user's
instructions, seeded, so every client of a bench sends exactly the same content.

The model is a random one, so the script, not the model, decides the agent's course: each turn names
the tool the model must call (the request's `tool_choice`), and the tool's result is the script's, not
a function of the arguments the model wrote. Results look like what coding agents read (source files,
grep output, test logs, directory listings, diffs) and are sized in characters from a token target
(`CHARS_PER_TOKEN`, measured on the bench models' tokenizer), so building a script needs no tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Characters per token of this kind of text with the random models' BPE tokenizer (measured: ~1.5).
CHARS_PER_TOKEN = 1.5

MODULES = ("parser", "session", "scheduler", "cache", "router", "tokenizer", "config", "metrics", "storage",
           "planner")
VERBS = ("load", "parse", "flush", "resolve", "render", "apply", "merge", "evict", "schedule", "validate",
         "encode", "decode")
NOUNS = ("block", "request", "window", "prefix", "entry", "token", "budget", "state", "record", "snapshot")
ERRORS = ("KeyError", "ValueError", "AssertionError", "TypeError", "TimeoutError")
WORDS = ("the", "a", "when", "each", "every", "is", "are", "kept", "sent", "read", "once", "before", "after",
         "cached", "stale", "empty", "new", "old", "first", "last", "so", "not", "only", "until")

# Few choices per argument: the tools' schemas are rendered into every prompt.
PATHS = tuple(f"flowctl/{m}.py" for m in MODULES[:4])
TEST_TARGETS = tuple(f"tests/test_{m}.py" for m in MODULES[:3]) + ("tests",)
DIRS = ("flowctl", "tests", "docs", "scripts")
PATTERNS = tuple(f"{v}_{n}" for v, n in zip(VERBS[:4], NOUNS[:4]))


def _tool(name: str, description: str, parameter: str, choices: tuple[str, ...]) -> dict[str, Any]:
    # Strict, with enumerated arguments: vLLM's grammar then pins the arguments to the schema (a tool
    # that is not strict gets only its call's envelope pinned) and ends the call within a few tokens,
    # whatever the weights.
    return {"type": "function", "function": {
        "name": name, "description": description, "strict": True,
        "parameters": {"type": "object", "properties": {parameter: {"type": "string", "enum": list(choices)}},
                       "required": [parameter], "additionalProperties": False}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("read_file", "Read a file.", "path", PATHS),
    _tool("grep", "Search the code.", "pattern", PATTERNS),
    _tool("run_tests", "Run pytest.", "target", TEST_TARGETS),
    _tool("list_dir", "List a directory.", "path", DIRS),
    _tool("git_diff", "Show a file's changes.", "path", PATHS),
)
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)

IDENTITY = (
    "You are a coding agent working in the repository flowctl, a Python service that schedules and caches "
    "requests for a fleet of workers. Work in small steps: read the code before you change it, run the "
    "tests after every change, and say what you found in a sentence or two. Use the tools; never guess a "
    "file's content. Keep the public API stable and every existing test passing.")
CONVENTIONS = "\n".join((
    "- Python 3.11, type hints everywhere, dataclasses for data.",
    "- Errors are exceptions from flowctl.errors, never None returns.",
    "- Every fix comes with a regression test in tests/.",
    "- Run `pytest -q` before reporting; quote the first traceback line of a failure.",
))


@dataclass(frozen=True)
class ScriptTurn:
    """One request of the agent: the result of the previous turn's tool call (None on the first turn),
    a new user instruction (or None), and the tool the model must call in reply."""

    tool_result: str | None
    instruction: str | None
    tool: str


@dataclass(frozen=True)
class ScriptSpec:
    """The sizes a script is built to."""

    turns: int
    seed: int = 0
    result_min_tokens: int = 100
    result_max_tokens: int = 1500
    user_every: int = 4  # a new user instruction every this many turns (the first turn always has one)


@dataclass(frozen=True)
class AgentScript:
    identity: str
    codex: tuple[dict[str, str], ...]
    turns: tuple[ScriptTurn, ...]
    spec: ScriptSpec

    def system_prompt(self) -> str:
        """Identity and Codex as an ordinary client's system message."""
        return "\n\n".join([self.identity, *(f"## {d['id']}\n{d['text']}" for d in self.codex)])

    def new_messages(self, index: int, call_id: str | None) -> list[dict[str, Any]]:
        """What turn `index` adds to the conversation: the tool message answering `call_id` (the previous
        reply's call), then the user's instruction, where the script has them."""
        turn = self.turns[index]
        messages: list[dict[str, Any]] = []
        if turn.tool_result is not None:
            if call_id is None:
                raise ValueError(f"turn {index} carries a tool result but no tool call preceded it")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": turn.tool_result})
        if turn.instruction is not None:
            messages.append({"role": "user", "content": turn.instruction})
        return messages

    def tool_choice(self, index: int) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.turns[index].tool}}


def build_script(spec: ScriptSpec) -> AgentScript:
    """The whole session. Each turn is drawn from its own seed, so a shorter script is a prefix of a
    longer one with the same seed."""
    if spec.turns < 1 or spec.user_every < 1 or not 0 < spec.result_min_tokens <= spec.result_max_tokens:
        raise ValueError(f"invalid script sizes: {spec}")
    codex = ({"id": "conventions", "text": CONVENTIONS},
             {"id": "architecture", "text": architecture(np.random.default_rng([spec.seed, 0xC0DE]))})
    turns: list[ScriptTurn] = []
    for index in range(spec.turns):
        rng = np.random.default_rng([spec.seed, index])
        tool = TOOL_NAMES[int(rng.integers(len(TOOL_NAMES)))]
        result = None
        if index > 0:
            previous = turns[-1].tool
            result = tool_result(previous, rng, result_chars(rng, spec.result_min_tokens, spec.result_max_tokens))
        instruction = user_instruction(rng, index) if index % spec.user_every == 0 else None
        turns.append(ScriptTurn(result, instruction, tool))
    return AgentScript(IDENTITY, codex, tuple(turns), spec)


def result_chars(rng: np.random.Generator, min_tokens: int, max_tokens: int) -> int:
    """A result's size: log-uniform between the bounds (many short results, a few long ones)."""
    tokens = math.exp(rng.uniform(math.log(min_tokens), math.log(max_tokens)))
    return int(tokens * CHARS_PER_TOKEN)


def pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def symbol(rng: np.random.Generator) -> str:
    return f"{pick(rng, VERBS)}_{pick(rng, NOUNS)}"


def sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(pick(rng, WORDS) for _ in range(words))


def architecture(rng: np.random.Generator) -> str:
    lines = ["flowctl's modules, and what each owns:"]
    for module in MODULES[:6]:
        calls = ", ".join(f"{symbol(rng)}()" for _ in range(2))
        lines.append(f"- flowctl/{module}.py: {calls}; the {pick(rng, NOUNS)} is {sentence(rng, 6)}.")
    return "\n".join(lines)


def user_instruction(rng: np.random.Generator, index: int) -> str:
    module, name = pick(rng, MODULES), symbol(rng)
    asks = (f"The test test_{name} fails with {pick(rng, ERRORS)}; find the cause in flowctl/{module}.py and fix it.",
            f"Add a regression test for {module}.{name} in tests/test_{module}.py, then run it.",
            "Run the whole suite again and tell me what still fails, with the first traceback line of each.",
            f"Refactor {module}.{name} so it no longer mutates its argument; keep the public API as it is.",
            f"Check every caller of {name} and make sure none passes a stale {pick(rng, NOUNS)}.")
    return f"Step {index}: {pick(rng, asks)} Note: {sentence(rng, 10)}."


def code_line(rng: np.random.Generator) -> str:
    noun, other = pick(rng, NOUNS), pick(rng, NOUNS)
    return pick(rng, (
        f"    def {symbol(rng)}(self, {noun}: {noun.title()}) -> {other.title()} | None:",
        f"        {noun} = self._{other}s.get({noun}.key)",
        f"        if {noun} is None or {noun}.{pick(rng, NOUNS)}_id != {other}.id:",
        f"            raise {pick(rng, ERRORS)}(f\"{noun} {{{noun}.key}} is {pick(rng, WORDS)} {pick(rng, WORDS)}\")",
        f"        return self.{symbol(rng)}({noun}, {other}=self._{other})",
        f"        # {sentence(rng, 8)}",
        f"        for {noun} in sorted(self._{other}s.values(), key=lambda e: e.{pick(rng, NOUNS)}):",
        f"            self._{noun}s[{noun}.key] = {noun}.{symbol(rng)}()",
        f"class {noun.title()}{other.title()}:",
        "",
    ))


def file_read(rng: np.random.Generator, chars: int) -> list[str]:
    path = pick(rng, PATHS)
    lines = [f"# {path}"]
    start = int(rng.integers(1, 400))
    while sum(len(line) + 1 for line in lines) < chars:
        lines.append(f"{start + len(lines):>5}  {code_line(rng)}")
    return lines


def grep_output(rng: np.random.Generator, chars: int) -> list[str]:
    pattern = symbol(rng)
    lines = [f"$ grep -rn {pattern} flowctl tests"]
    while sum(len(line) + 1 for line in lines) < chars:
        where = pick(rng, PATHS + TEST_TARGETS[:-1])
        lines.append(f"{where}:{int(rng.integers(1, 900))}:{code_line(rng).replace(symbol(rng), pattern, 1)}")
    return lines


def test_log(rng: np.random.Generator, chars: int) -> list[str]:
    target = pick(rng, TEST_TARGETS)
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
             f"collected {int(rng.integers(8, 400))} items", ""]
    while sum(len(line) + 1 for line in lines) < chars:
        outcome = "FAILED" if rng.random() < 0.15 else "PASSED"
        lines.append(f"{target}::test_{symbol(rng)} {outcome} [{int(rng.integers(1, 100)):>3}%]")
        if outcome == "FAILED":
            lines += [f">       assert {pick(rng, NOUNS)}.{pick(rng, NOUNS)}_id == {int(rng.integers(100))}",
                      f"E       {pick(rng, ERRORS)}: {sentence(rng, 7)}",
                      f"{pick(rng, PATHS)}:{int(rng.integers(1, 900))}: {pick(rng, ERRORS)}"]
    return lines


def dir_listing(rng: np.random.Generator, chars: int) -> list[str]:
    where = pick(rng, DIRS)
    lines = [f"$ ls -l {where}"]
    while sum(len(line) + 1 for line in lines) < chars:
        size, day = int(rng.integers(120, 40_000)), int(rng.integers(1, 29))
        lines.append(f"-rw-r--r-- 1 dev dev {size:>6} Mar {day:>2} 10:{int(rng.integers(60)):02d} "
                     f"{pick(rng, MODULES)}_{pick(rng, NOUNS)}.py")
    return lines


def git_diff(rng: np.random.Generator, chars: int) -> list[str]:
    path = pick(rng, PATHS)
    lines = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}"]
    while sum(len(line) + 1 for line in lines) < chars:
        at = int(rng.integers(1, 800))
        lines.append(f"@@ -{at},7 +{at},8 @@ def {symbol(rng)}(self):")
        lines += [f"{pick(rng, (' ', ' ', '-', '+'))}{code_line(rng)}" for _ in range(6)]
    return lines


RESULTS: dict[str, Callable[[np.random.Generator, int], list[str]]] = {
    "read_file": file_read, "grep": grep_output, "run_tests": test_log, "list_dir": dir_listing, "git_diff": git_diff}


def tool_result(tool: str, rng: np.random.Generator, chars: int) -> str:
    """What the fake `tool` returns, about `chars` long (cut at a line end)."""
    text = "\n".join(RESULTS[tool](rng, chars))
    return text[:max(text.rfind("\n", 0, chars + 1), chars // 2)]
