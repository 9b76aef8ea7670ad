"""AHC's log lines go where vLLM's go: one stream, one format, one clock for the whole server.

vLLM configures only its own `vllm` logger tree: its default handler and format, the dictConfig of
VLLM_LOGGING_CONFIG_PATH (`--logging-config`), or nothing at all with VLLM_CONFIGURE_LOGGING=0. AHC's
loggers are named after its packages, outside that tree, so without this their INFO lines would be
dropped and their warnings printed bare by Python's last-resort handler.
"""

from __future__ import annotations

import logging
from argparse import Namespace

AHC_LOGGERS: tuple[str, ...] = ("ahc", "server", "orchestrator", "xdb")


def configure_logging(args: Namespace) -> None:
    """Apply vLLM's logging configuration from its parsed flags (as `vllm serve` does at start-up), then
    point AHC's loggers at the handlers it gave the `vllm` logger."""
    from vllm.logger import configure_logging_from_args

    if configure_logging_from_args(args).configure_logging:
        follow_vllm_logging()


def follow_vllm_logging() -> None:
    """Give each AHC logger the `vllm` logger's handlers, level and propagation. A logger the user's own
    config already set up (a level or handlers of its own) is left as that config made it."""
    source = logging.getLogger("vllm")
    for name in AHC_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers or logger.level != logging.NOTSET:
            continue
        logger.handlers = list(source.handlers)
        logger.setLevel(source.level)
        logger.propagate = source.propagate
