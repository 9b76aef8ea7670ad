"""The discovery loop: Think -> Act -> Observe -> Formalise, one turn at a time.

Reset: a fresh run purges the run's rows ("You know nothing"). Each turn the policy writes its
journal entry and makes one or more tool calls (Think, Act); the results are harvested as evidence,
appended to the journal (tier 3) and logged to interaction_log (Observe); theorems are stored by
the policy's own store_theorem calls (Formalise). After the turn: compaction when tier 3 is over
its threshold, the termination check, the checkpoint that makes the turn count, and the run's
progress row (agent/history.py). A fresh run first reads what earlier runs on its rule refuted.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import compaction, termination
from agent.checkpoint import Checkpoint
from agent.context import context_field, identity_text
from agent.evidence import Evidence
from agent.history import progress_of, read_prior
from agent.journal import Journal, JournalEntry
from agent.knowledge import Knowledge
from agent.policies.base import ContextOverflow, Policy, Reply, TurnInput
from agent.progress import Progress
from agent.run_store import RunStore
from agent.tools import Toolbox
from agent.turn_metrics import Referee, TurnMetrics
from universe.harness import Harness
from universe.rule import Rule

log = logging.getLogger("ahc.agent")

REAL_MODEL_COMPACTION = 50_000  # tokens of tier 3 before a compaction, on a large window
RESULT_CHARS = {"full": 2000, "compact": 800, "minimal": 300}  # a tool result's share of the prompt


@dataclass
class RunConfig:
    data_dir: Path
    max_turns: int = 50
    compaction_tokens: int | None = None  # None: a third of the model's window, at most 50k
    keep_turns: int = compaction.KEEP_TURNS  # the newest turns a compaction keeps verbatim...
    keep_share: float = compaction.KEEP_SHARE  # ...within this share of the compaction threshold
    seed: int = 0
    fresh: bool = False
    rule_label: str | None = None  # the rule's part of the run id (rule_label_for); None: the rule's name


# A run id names the run's folder under the data dir, so its rule part must be a plain file name: no
# path separator or "..", and not hidden.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


def run_id_for(rule: str, policy: str, seed: int) -> str:
    """`{rule}-{policy}-seed{seed}`; ValueError unless `rule` is a plain name ([A-Za-z0-9_.-], not
    starting with a dot)."""
    if not _PLAIN_NAME.fullmatch(rule):
        raise ValueError(f"rule name {rule!r} cannot name a run: use letters, digits, '_', '.' and '-' "
                         "(not starting with '.'), or load the rule from a file with such a name")
    return f"{rule}-{policy}-seed{seed}"


def rule_label_for(source: str | Path, rule: Rule) -> str:
    """The rule's part of a run id: a rule file's stem when the rule came from a file (the name
    inside the file is the author's to choose), else the rule's (bundled) name."""
    path = Path(source)
    return path.stem if path.is_file() else rule.name


class DiscoveryRun:
    def __init__(self, config: RunConfig, rule: Rule, policy: Policy, store: RunStore,
                 progress: Progress | None = None) -> None:
        self.config, self.rule, self.policy, self.store = config, rule, policy, store
        self.progress = progress or Progress(enabled=False)
        self.rule_label = config.rule_label or rule.name
        self.run_id = run_id_for(self.rule_label, policy.name, config.seed)
        self.run_dir = Path(config.data_dir) / self.run_id
        self.referee = Referee(rule)
        self.identity = identity_text(policy.prompt_size)
        self.fresh_epoch = True  # the next request opens a new server session (start, resume, compaction)
        self._restore()

    # ---- set-up: fresh or resumed ------------------------------------------------------------------
    def _restore(self) -> None:
        ckpt = None if self.config.fresh else Checkpoint.load(self.run_dir)
        if ckpt is None:
            self.store.purge(self.run_id)  # "You know nothing": the run's history starts empty
            ckpt = Checkpoint(self.run_id, self.rule.name, self.policy.name, self.config.seed, store=self.store.kind)
        else:
            if ckpt.store != self.store.kind:
                raise ValueError(f"run {self.run_id} keeps its history in the {ckpt.store} store, but this run "
                                 f"would use the {self.store.kind} one; rerun with --fresh")
            ckpt.attempt += 1
        self.ckpt = ckpt
        self.resumed_from = ckpt.turn if ckpt.attempt > 1 else None
        self.harness = Harness(self.rule, seed=self.config.seed)
        if ckpt.harness:
            for key in ("experiments", "predictions_checked", "cells_observed", "submissions"):
                setattr(self.harness, key, ckpt.harness[key])
            self.harness.rng.bit_generator.state = ckpt.harness["rng"]
        self.evidence = Evidence.from_json(ckpt.evidence)
        self.knowledge = Knowledge.from_json(ckpt.knowledge)
        self.journal = Journal.from_json(ckpt.journal, RESULT_CHARS[self.policy.prompt_size])
        if ckpt.turn == 0:  # a resumed run keeps what it read at its start (in its checkpoint's knowledge)
            read_prior(self.store, self.rule_label, self.knowledge)
        self.toolbox = Toolbox(self.harness, self.store, self.run_id, self.knowledge, turn=ckpt.turn,
                               rule=self.rule_label, valid_row=ckpt.valid_row, submissions=ckpt.submissions)
        self.policy.attach(self.evidence)
        if ckpt.policy_state:
            self.policy.load_json(ckpt.policy_state)
        self.metrics = [TurnMetrics(**m) for m in ckpt.metrics]
        latest = self.store.meta_knowledge(self.run_id)
        if self.knowledge.theorems and (latest or {}).get("theorems_json") != self.knowledge.theorems_json():
            self.toolbox.snapshot()  # a theorem stored by a turn the kill cut off is not part of the run

    @property
    def session_id(self) -> str:
        return f"{self.run_id}-{self.ckpt.nonce}-a{self.ckpt.attempt}-c{self.ckpt.compactions}"

    @property
    def threshold(self) -> int:
        if self.config.compaction_tokens:
            return self.config.compaction_tokens
        window = self.policy.context_window
        return min(REAL_MODEL_COMPACTION, window // 3) if window else REAL_MODEL_COMPACTION

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.progress.start(self.run_id, self.policy.name, self.rule.name, self.config.max_turns, self.resumed_from)
        stuck = False
        while True:
            verdict = termination.judge(self.ckpt.turn, self.config.max_turns, self.toolbox.submissions, stuck)
            if verdict.done:
                break
            stuck = self.turn(self.ckpt.turn + 1)
        self.ckpt.status, self.ckpt.reason = ("solved" if verdict.solved else "stopped"), verdict.reason
        self.save()
        self._record_progress()
        result = termination.summary(self.rule.name, self.policy.name, verdict, self.harness.counters(),
                                     self.ckpt.turn, self.ckpt.compactions, self.toolbox.submissions,
                                     self.policy.theory())
        from agent.report import write_report

        write_report(self.run_dir, result, self.metrics, self.knowledge, self.ckpt, verdict.reason)
        self._upload_report()
        self.progress.finish(result)
        return result

    def _record_progress(self) -> None:
        """The run's figures so far into run_progress: the latest row is its outcome, even if it is killed."""
        self.store.record_progress(self.run_id, progress_of(self.rule_label, self.policy, self.ckpt.status,
                                                            self.ckpt.turn, self.knowledge, self.metrics))

    def _upload_report(self) -> None:
        """The report PNG into the store, for a UI on the server to show. The run is over and its
        files are written: a store that cannot take the report costs a warning, not the run."""
        try:
            self.store.save_report(self.run_id, (self.run_dir / "report.png").read_bytes())
        except Exception as exc:  # a server down, an old server without the route, a full disk
            log.warning("run %s: report.png not saved to the %s store: %s", self.run_id, self.store.kind, exc)

    def turn(self, n: int) -> bool:
        """One turn, from the question to the checkpoint; True if the policy gave up."""
        started = time.monotonic()
        query = self._query(n)
        reply = self._ask(n, query)
        entry = JournalEntry(n, query, reply.note, list(reply.calls), [], reply.error)
        self.toolbox.turn = n
        for call in reply.calls:
            result = self.toolbox.call(call.name, call.arguments)
            arguments = call.parsed()
            self.evidence.add_result(call.name, arguments if isinstance(arguments, dict) else {}, result)
            entry.results.append(result)
        for row in entry.rows(self.ckpt.attempt):
            self.store.log_interaction(self.run_id, **row)
        self.journal.append(entry)
        self.policy.observe(entry)
        self.ckpt.turn = n
        self.ckpt.turn_attempts.append(self.ckpt.attempt)
        self.ckpt.last_error = reply.error
        self.fresh_epoch = False
        used = reply.usage.prompt_tokens + reply.usage.completion_tokens if reply.usage else None
        if compaction.due(self.journal, self.threshold, used, self.policy.context_window, self.policy.reply_tokens,
                          self.config.keep_turns, self.keep_tokens):
            self._compact()
        self.metrics.append(self._measure(n, entry, reply, time.monotonic() - started))
        self.save()
        self._record_progress()
        self.progress.update(self.metrics[-1])
        return reply.stop

    def _query(self, n: int) -> str:
        text = f"Turn {n} of {self.config.max_turns}. Experiments so far: {self.harness.experiments}."
        if self.ckpt.last_error:
            text += f" Last turn: {self.ckpt.last_error}."
        return text + " Write your LAB NOTE, then call a tool."

    @property
    def keep_tokens(self) -> int:
        """What the turns kept verbatim through a compaction may take together."""
        return int(self.threshold * self.config.keep_share)

    def _ask(self, n: int, query: str) -> Reply:
        """The policy's reply; a prompt over the window compacts the journal and asks again, keeping a
        quarter of the usual recent turns' tokens, then none."""
        for keep_tokens in (self.keep_tokens // 4, 0, None):
            try:
                return self.policy.decide(self._turn_input(n, query))
            except ContextOverflow as exc:
                if keep_tokens is None or not self.journal.entries:
                    raise RuntimeError(
                        f"the prompt does not fit the model's window even after compaction: {exc}") from None
                self._compact(keep_tokens, at_least=0)
        raise AssertionError("unreachable")

    def _turn_input(self, n: int, query: str) -> TurnInput:
        # The server keeps the session's State: a continuing session gets only what is new (the
        # last turn's tool results and this turn's question); a new one gets the journal replayed.
        if self.fresh_epoch:
            messages = self.journal.messages()
        else:
            messages = self.journal.entries[-1].result_messages(self.journal.max_result_chars)
        messages = messages + [{"role": "user", "content": query}]
        context = context_field(self.session_id, self.identity, self.knowledge, self.policy.prompt_size)
        return TurnInput(n, query, messages, context, self.evidence, self.knowledge)

    def _compact(self, keep_tokens: int | None = None, at_least: int = 1) -> None:
        """Condense the journal but its newest turns (`keep_tokens`: what they may take, None: the usual;
        `at_least`: how many stay whatever their size)."""
        budget = self.keep_tokens if keep_tokens is None else keep_tokens
        if compaction.compact(self.journal, self.policy, self.toolbox, self.config.keep_turns, budget,
                              at_least) is not None:
            self.ckpt.compactions += 1
            self.fresh_epoch = True

    def _measure(self, n: int, entry: JournalEntry, reply: Reply, wall_s: float) -> TurnMetrics:
        counters = self.harness.counters()
        return TurnMetrics(
            turn=n, experiments=counters["experiments"], predictions_checked=counters["predictions_checked"],
            cells_observed=counters["cells_observed"], coverage=self.referee.coverage(self.evidence),
            accuracy=self.referee.accuracy(self.policy.theory()), compactions=self.ckpt.compactions,
            tools=[c.name for c in entry.calls], prompt_tokens=reply.usage.prompt_tokens if reply.usage else None,
            cached_tokens=reply.usage.cached_tokens if reply.usage else None,
            first_changed_block=(reply.report or {}).get("first_changed_block"), wall_s=round(wall_s, 3))

    def save(self) -> None:
        ckpt = self.ckpt
        ckpt.harness = {**self.harness.counters(), "rng": self.harness.rng.bit_generator.state}
        ckpt.evidence = self.evidence.to_json()
        ckpt.journal = self.journal.to_json()
        ckpt.knowledge = self.knowledge.to_json()
        ckpt.submissions = self.toolbox.submissions
        ckpt.policy_state = self.policy.to_json()
        ckpt.metrics = [m.to_json() for m in self.metrics]
        ckpt.save(self.run_dir)
