"""Logging for the ``gpudra`` processes: structlog JSON (daemons) or console (terminals).

Our own loggers (``structlog.get_logger``) render in structlog and write each line straight
to stderr: the stdlib route (a ``LogRecord``, its ``findCaller`` stack walk, a formatter)
cost the node daemon a sizeable share of a kubelet call's CPU per line (``bench/RESULTS.md``,
third session). gRPC and the
Kubernetes client log through stdlib ``logging``; the ProcessorFormatter bridge sends them
through the same processors and renderer, so every line has one shape. Below the level a
call returns at once (structlog's filtering logger). Configure once, at process start:
structlog ignores a second configure after a logger was cached. :func:`fatal_line` writes a
line of the same shape without any of that, so a fatal error is one JSON line whether or
not logging was configured when it happened.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, MutableMapping
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["json", "console", "auto"]

_TIMESTAMP = structlog.processors.TimeStamper(fmt="iso", utc=True)


def _fallback(obj: Any) -> Any:
    """What JSON cannot say: an object's ``__structlog__()``, else its ``repr``."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


# One encoder for every line: ``json.dumps`` with any option builds a new one per call.
_ENCODE = json.JSONEncoder(default=_fallback, separators=(",", ":")).encode


def render_json(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> str:
    """The final processor of JSON lines: one compact JSON object."""
    try:
        return _ENCODE(event_dict)
    except (TypeError, ValueError):
        # A value JSON cannot hold (a dict with non-string keys, a cycle) becomes its repr:
        # a log line must never raise into the caller, maybe after a checkpoint commit.
        return _ENCODE({str(k): _encodable(v) for k, v in event_dict.items()})


def _encodable(value: Any) -> Any:
    try:
        _ENCODE(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


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
    print(render_json(None, "critical", entry), file=sys.stderr, flush=True)


class LineLogger:
    """The logger under our structlog loggers: writes each rendered line to one stream.

    ``name`` is what ``add_logger_name`` puts in the line. One ``write`` per line, under
    the stdlib handler's lock, so lines from both routes and from any thread never mix."""

    __slots__ = ("_lock", "_stream", "name")

    def __init__(self, name: str, stream: TextIO, lock: threading.RLock) -> None:
        self.name = name
        self._stream = stream
        self._lock = lock

    def msg(self, line: str) -> None:
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                # A closed or broken stderr loses the line, as a stdlib handler would; it
                # must not fail the kubelet call that logged it.
                pass

    debug = info = warning = error = critical = exception = msg


class LineLoggerFactory:
    """``structlog.configure(logger_factory=...)``: a :class:`LineLogger` per name; unnamed
    (``structlog.get_logger()``), the calling module's name, as the stdlib factory does."""

    def __init__(self, stream: TextIO, lock: threading.RLock) -> None:
        self._stream = stream
        self._lock = lock

    def __call__(self, *args: Any) -> LineLogger:
        name = str(args[0]) if args else _caller_module()
        return LineLogger(name, self._stream, self._lock)


def _caller_module() -> str:
    """The module name of the first frame outside structlog and this module."""
    frame = sys._getframe(1)
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).startswith(
            ("structlog", __name__)):
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", "?"))


def configure_logging(*, fmt: LogFormat = "auto", level: str = "info",
                      stream: TextIO | None = None) -> None:
    """Set up both routes to ``stream`` (stderr by default) at ``level``."""
    fmt = resolve_format(fmt)
    out = sys.stderr if stream is None else stream
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _TIMESTAMP,
    ]
    renderer: Callable[..., Any]
    if fmt == "json":
        renderer = render_json
        shared.append(structlog.processors.dict_tracebacks)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    assert handler.lock is not None  # created by Handler.__init__
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"Unknown level: {level!r}")  # what logging itself says
    structlog.configure(
        processors=[*shared, renderer],
        logger_factory=LineLoggerFactory(out, handler.lock),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # Not cached: a module's logger cached on first use keeps the configuration of that
        # moment for good, so a second command in the same process (the demo, tests) would
        # log to the first one's stream, and structlog's capture_logs would see nothing.
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # The Kubernetes client logs every request body at DEBUG; keep it out unless asked.
    logging.getLogger("kubernetes").setLevel(max(root.level, logging.INFO))
