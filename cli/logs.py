"""Logging for the ``gpudra`` processes: structlog JSON (daemons) or console (terminals).

gRPC and the Kubernetes client log through stdlib ``logging``; the ProcessorFormatter
bridge sends them through the same pipeline, so every line has one shape. Configure once,
at process start: structlog ignores a second configure after a logger was cached.
:func:`fatal_line` writes a line of the same shape without any of that, so a fatal error is
one JSON line whether or not logging was configured when it happened.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

LogFormat = Literal["json", "console", "auto"]

_TIMESTAMP = structlog.processors.TimeStamper(fmt="iso", utc=True)


def resolve_format(fmt: LogFormat) -> Literal["json", "console"]:
    """``auto``: console on a terminal, else JSON."""
    if fmt == "auto":
        return "console" if sys.stderr.isatty() else "json"
    return fmt


def fatal_line(event: str, *, logger: str = "gpudra.node", exc_info: bool = False,
               **fields: Any) -> None:
    """One JSON log line at level ``critical`` on stderr, shaped like the configured ones;
    ``exc_info``: the exception being handled, as a structured traceback in that line."""
    entry: MutableMapping[str, Any] = {**fields, "event": event, "level": "critical",
                                       "logger": logger}
    if exc_info:
        entry["exc_info"] = True
        entry = structlog.processors.dict_tracebacks(None, "critical", entry)
    entry = _TIMESTAMP(None, "critical", entry)
    print(structlog.processors.JSONRenderer()(None, "critical", entry), file=sys.stderr,
          flush=True)


def configure_logging(*, fmt: LogFormat = "auto", level: str = "info") -> None:
    fmt = resolve_format(fmt)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _TIMESTAMP,
    ]
    renderer: structlog.types.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.dict_tracebacks)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The Kubernetes client logs every request body at DEBUG; keep it out unless asked.
    logging.getLogger("kubernetes").setLevel(max(root.level, logging.INFO))
