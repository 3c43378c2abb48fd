"""Log lines: our loggers (structlog's own route) and foreign ones (stdlib: grpc, kubernetes)
end up with one shape; below the level nothing is rendered; fatal lines match."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gpudra.cli.logs import configure_logging, fatal_line

SHAPE = ["event", "level", "logger", "timestamp"]


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    """A stream to configure logging to; structlog and the root logger restored after."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    kubernetes_level = logging.getLogger("kubernetes").level
    try:
        yield io.StringIO()
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("kubernetes").setLevel(kubernetes_level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def fresh(name: str) -> Any:
    """A logger proxy of our own: module-level ones would keep this test's configuration
    cached for the tests after it."""
    return structlog.get_logger(name)


def test_our_lines_and_foreign_lines_have_one_shape(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)
    fresh("gpudra.test").bind(method="v1.X").info("call done", claims=1, prepared={"a": ["b"]})
    logging.getLogger("grpc").warning("foreign %s", "line")
    ours, foreign = lines(out)
    assert list(ours) == ["method", "claims", "prepared", *SHAPE]
    assert ours | {"timestamp": None} == {
        "method": "v1.X", "claims": 1, "prepared": {"a": ["b"]}, "event": "call done",
        "level": "info", "logger": "gpudra.test", "timestamp": None}
    assert list(foreign) == SHAPE
    assert foreign | {"timestamp": None} == {
        "event": "foreign line", "level": "warning", "logger": "grpc", "timestamp": None}
    for line in (ours, foreign):
        assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]
    # One compact JSON object per line, whichever route wrote it.
    assert all(", " not in raw for raw in out.getvalue().splitlines())


def test_exceptions_are_dict_tracebacks_on_both_routes(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)
    try:
        raise ValueError("broken")
    except ValueError:
        fresh("gpudra.test").exception("driver failed", claim="ns/c:u")
        logging.getLogger("grpc").error("grpc saw it", exc_info=True)
    ours, foreign = lines(out)
    for line in (ours, foreign):
        [exception] = line["exception"]
        assert exception["exc_type"] == "ValueError" and exception["exc_value"] == "broken"
        assert any(frame["name"] == "test_exceptions_are_dict_tracebacks_on_both_routes"
                   for frame in exception["frames"])
        assert line["level"] == "error" and "exc_info" not in line
    assert ours["claim"] == "ns/c:u"


def test_below_the_level_nothing_is_rendered_on_either_route(out: io.StringIO):
    class Unrenderable:
        def __repr__(self) -> str:
            raise AssertionError("rendered although below the level")

    configure_logging(fmt="json", level="warning", stream=out)
    log = fresh("gpudra.test")
    log.debug("quiet", field=Unrenderable())
    log.info("quiet", field=Unrenderable())
    logging.getLogger("grpc").info("quiet")
    assert not log.is_enabled_for(logging.INFO) and log.is_enabled_for(logging.WARNING)
    log.warning("loud")
    logging.getLogger("grpc").warning("loud too")
    assert [(line["event"], line["logger"]) for line in lines(out)] == [
        ("loud", "gpudra.test"), ("loud too", "grpc")]


def test_the_kubernetes_client_stays_at_info_unless_debug_is_asked_for(out: io.StringIO):
    configure_logging(fmt="json", level="debug", stream=out)
    fresh("gpudra.test").debug("ours", n=1)
    logging.getLogger("kubernetes.client.rest").debug("request body")
    assert [line["event"] for line in lines(out)] == ["ours"]


def test_an_unnamed_logger_is_named_after_its_module(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)
    structlog.get_logger().info("who am I")
    [line] = lines(out)
    assert line["logger"] == __name__


def test_lines_from_many_threads_never_mix(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)

    def write(n: int) -> None:
        log, foreign = fresh(f"gpudra.t{n}"), logging.getLogger(f"grpc.t{n}")
        for i in range(200):
            log.info("line", n=n, i=i, pad="x" * 300)
            foreign.warning("foreign %d", i)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(lines(out)) == 4 * 200 * 2  # each one parses: no line was cut into another


def test_the_console_format_renders_both_routes(out: io.StringIO):
    configure_logging(fmt="console", level="info", stream=out)
    fresh("gpudra.test").info("call done", claims=1)
    logging.getLogger("grpc").warning("foreign line")
    ours, foreign = out.getvalue().splitlines()
    assert "call done" in ours and "info" in ours and "claims" in ours and "=1" in ours
    assert "foreign line" in foreign and "warning" in foreign and "grpc" in foreign
    assert not ours.startswith("{")


def test_a_fatal_line_has_the_shape_of_the_configured_ones(
        out: io.StringIO, capsys: pytest.CaptureFixture[str]):
    configure_logging(fmt="json", level="info", stream=out)
    fresh("gpudra.node").info("running")
    try:
        raise RuntimeError("bug")
    except RuntimeError:
        fatal_line("node daemon failed", error="RuntimeError: bug", exc_info=True)
    [configured] = lines(out)
    fatal = json.loads(capsys.readouterr().err)
    assert set(SHAPE) <= set(fatal) and fatal["level"] == "critical"
    assert fatal["logger"] == configured["logger"] == "gpudra.node"
    assert fatal["exception"][0]["exc_type"] == "RuntimeError"


def test_a_closed_stream_loses_lines_but_does_not_fail_the_caller(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)
    out.close()
    fresh("gpudra.test").info("lost")
    logging.getLogger("grpc").warning("lost too")


def test_an_unknown_level_is_refused(out: io.StringIO):
    with pytest.raises(ValueError, match="Unknown level: 'loud'"):
        configure_logging(fmt="json", level="loud", stream=out)


def test_a_value_json_cannot_hold_is_its_repr_and_never_raises(out: io.StringIO):
    configure_logging(fmt="json", level="info", stream=out)
    cycle: list[Any] = []
    cycle.append(cycle)
    fresh("gpudra.test").warning("odd values", keys={(1, 2): 3}, cycle=cycle, fine=[1])
    (line,) = lines(out)
    assert line["keys"] == "{(1, 2): 3}"
    assert line["cycle"] == "[[...]]"
    assert line["fine"] == [1]
    assert line["event"] == "odd values"
