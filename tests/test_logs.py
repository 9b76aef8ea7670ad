"""AHC's log lines through vLLM's logging configuration, one line per chat request, and a Ctrl-C'd
`ahc serve` that ends without a page of nanobind leak reports."""

from __future__ import annotations

import io
import logging
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.servers import start_server
from server.cluster.server_process import ServerProcess
from server.telemetry.logs import AHC_LOGGERS, follow_vllm_logging

# vLLM's default format: "(MainProcess pid=12) INFO 05-06 07:08:09 [file.py:12] message"
VLLM_LINE = r"\(\S+ pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] "


@pytest.fixture
def vllm_handler() -> Iterator[io.StringIO]:
    """The `vllm` logger writing to a buffer with vLLM's own formatter; every logger put back after."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG
    from vllm.logging_utils import NewLineFormatter

    names = ("vllm", *AHC_LOGGERS)
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in names}
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    vllm_format = DEFAULT_LOGGING_CONFIG["formatters"]["vllm"]
    handler.setFormatter(NewLineFormatter(vllm_format["format"], datefmt=vllm_format["datefmt"]))
    vllm = logging.getLogger("vllm")
    vllm.handlers, vllm.propagate = [handler], False
    vllm.setLevel(logging.INFO)
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_with_process_name(factory))
    try:
        yield buffer
    finally:
        logging.setLogRecordFactory(factory)
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)


def _with_process_name(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """The record attribute vLLM's format names (vLLM's own record factory adds it once configured)."""

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        record.vllm_process_name = record.processName
        return record

    return make


def test_ahc_loggers_write_through_vllms_handler_in_its_format(vllm_handler: io.StringIO) -> None:
    own = logging.StreamHandler(io.StringIO())
    logging.getLogger("xdb").handlers = [own]  # set up by the user's own config: left alone
    follow_vllm_logging()
    logging.getLogger("vllm.engine").info("engine line")
    logging.getLogger("ahc.requests").info("chat line")
    logging.getLogger("orchestrator.retrieval.scoped_indexes").warning("index line")
    logging.getLogger("server.model.token_process").debug("below vLLM's level")
    lines = vllm_handler.getvalue().splitlines()
    assert len(lines) == 3, lines
    for line, message in zip(lines, ("engine line", "chat line", "index line"), strict=True):
        assert re.fullmatch(VLLM_LINE + message, line), line
    assert logging.getLogger("xdb").handlers == [own]


@pytest.mark.engine
def test_the_server_logs_one_line_per_chat_request_in_vllms_format(server: ServerProcess,
                                                                   client: openai.OpenAI, model_name: str) -> None:
    identity = "You are a careful physicist who answers in one short sentence. " * 8  # several KV blocks
    for question in ("What moves?", "And then?"):
        client.chat.completions.create(model=model_name, max_tokens=2, messages=[{"role": "user", "content": question}],
                                       extra_body={"context": {"session_id": "log-line", "identity": identity}})
    lines = [line for line in server.log.read_text(errors="replace").splitlines() if "chat session=log-line " in line]
    assert len(lines) == 2, lines
    fields = r"chat session=log-line mode=cag prompt_tokens=\d+ cached_tokens=(\d+) first_changed_block=(\w+) "
    first, second = (re.fullmatch(VLLM_LINE + fields + r"governor=\S+ outcome=committed", line) for line in lines)
    assert first is not None and second is not None, lines
    assert first.group(2) == "none" and second.group(2) == "state"
    assert int(second.group(1)) > 0  # the session's Identity and first turn came from the prefix cache


@pytest.mark.slow
@pytest.mark.engine
def test_ctrl_c_stops_the_server_without_leak_reports(tmp_path: Path) -> None:
    """As `make run` then Ctrl-C: the default config (lens capture on), a request served, SIGINT."""
    srv = start_server(tmp_path / "xdb")
    try:
        srv.client().chat.completions.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        srv.process.send_signal(signal.SIGINT)
        assert srv.process.wait(90) == 0, srv.log_tail()
    except (subprocess.TimeoutExpired, openai.OpenAIError):
        srv.stop()
        raise
    output = srv.log.read_text(errors="replace")
    assert "Shutting down" in output
    assert "leaked" not in output and "nanobind" not in output, output[-4000:]
