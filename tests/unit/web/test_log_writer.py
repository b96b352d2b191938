"""LogWriter: log records written by a thread of their own, so that a pipe nobody reads blocks
nothing but that thread (app/web/log_writer.py)."""

from __future__ import annotations

import io
import logging
import os
import threading
import time

import pytest

from headscope.web.log_writer import DROPPED_NOTICE, install

LINE = "x" * 1000  # 64 of these fill a Linux pipe's default buffer (64 KiB)


@pytest.fixture
def pipe():
    """A pipe's write end as a text stream (the server's stdout, say), a reader to start on its
    read end, and what the reader has read."""
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    chunks: list[bytes] = []

    def drain() -> threading.Thread:
        def run() -> None:
            while data := os.read(r, 65536):
                chunks.append(data)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    yield stream, drain, chunks
    # The write end last: a writer thread left blocked on it must not write to a reused number.
    os.close(r)
    stream.close()


def logger_to(name: str, *handlers: logging.Handler) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers[:] = list(handlers)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log


def in_thread(fn, timeout: float = 60.0) -> float:
    """Run ``fn`` in a thread and return the seconds it took; fail if it does not return (blocked)."""
    t0 = time.monotonic()
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"blocked for over {timeout} s"
    return time.monotonic() - t0


def test_records_reach_their_handlers_with_their_formatters_and_levels_in_order(pipe):
    stream, drain, chunks = pipe
    every = logging.StreamHandler(stream)
    every.setFormatter(logging.Formatter("A %(levelname)s %(message)s"))
    warnings = logging.StreamHandler(stream)
    warnings.setLevel(logging.WARNING)
    warnings.setFormatter(logging.Formatter("W %(message)s"))
    log = logger_to("test.log_writer.order", every, warnings)
    reader = drain()
    writer = install([log])
    try:
        assert log.handlers != [every, warnings]  # taken over
        log.info("one %d", 1)
        log.warning("two")
        log.info("three")
    finally:
        assert writer.stop()
    assert log.handlers == [every, warnings]  # given back
    stream.close()
    reader.join(10)
    assert b"".join(chunks).decode().splitlines() == ["A INFO one 1", "A WARNING two", "W two", "A INFO three"]


def test_a_reader_that_stops_reading_blocks_no_logger_and_the_drops_are_said(pipe):
    stream, drain, chunks = pipe
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    notices = io.StringIO()
    notice_handler = logging.StreamHandler(notices)
    log = logger_to("test.log_writer.stall", handler)
    writer = install([log], capacity=100)
    writer.notice_targets = (notice_handler,)
    counted: list[int] = []
    writer.on_drop = lambda: counted.append(1)  # the server's /metrics counter
    try:
        # Written straight to the pipe, the 65th line would block until someone reads.
        took = in_thread(lambda: [log.info("%d %s", i, LINE) for i in range(5000)])
        assert took < 30
        assert writer.dropped_total >= 4000  # all but what the queue (100) and the pipe (about 65) hold
        reader = drain()
        assert writer.flush(timeout=30)
        log.info("after %s", "the reader came back")
        assert writer.flush(timeout=30)
    finally:
        assert writer.stop()
    stream.close()
    reader.join(10)
    lines = b"".join(chunks).decode().splitlines()
    assert lines[-1] == "after the reader came back"
    numbers = [int(line.split()[0]) for line in lines[:-1]]
    assert numbers == sorted(set(numbers))  # in order, none twice
    assert len(numbers) + writer.dropped_total == 5000
    assert len(counted) == writer.dropped_total
    # Said once the writer could write again (once per stall): how many were lost in all.
    said = notices.getvalue().splitlines()
    assert said and all(line == DROPPED_NOTICE % int(line.split()[0]) for line in said)
    assert sum(int(line.split()[0]) for line in said) == writer.dropped_total


def test_stop_gives_up_on_a_writer_that_cannot_write_and_nothing_blocks_after_it(pipe, monkeypatch):
    stream, drain, _ = pipe
    original = logging.StreamHandler(stream)
    log = logger_to("test.log_writer.stuck", original)
    writer = install([log], capacity=10)
    big = LINE * 20  # the first ten records are queued at once and fill the pipe
    in_thread(lambda: [log.info(big) for _ in range(200)])
    t0 = time.monotonic()
    assert writer.stop(timeout=0.5) is False
    assert time.monotonic() - t0 < 10
    # The writer is left blocked, and the logger still hands it records (dropped): no caller
    # ever writes to the pipe itself. What runs at exit (logging.shutdown flushes and closes
    # every handler) takes no lock the writer holds.
    assert log.handlers != [original]
    assert in_thread(lambda: [log.info(big) for _ in range(200)]) < 30
    in_thread(lambda: [original.acquire(), original.flush(), original.release()])
    # Once the pipe is read again, the writer catches up and a stop gives the handler back.
    reader = drain()
    assert writer.stop(timeout=30) is True
    assert log.handlers == [original]
    stream.close()
    reader.join(10)


def test_a_stream_without_a_file_descriptor_is_written_through_its_handler():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    log = logger_to("test.log_writer.stringio", handler)
    writer = install([log])
    log.info("hello %s", "world")
    assert writer.stop()
    assert out.getvalue() == "test.log_writer.stringio: hello world\n"
