"""The server's log lines are written by a thread of their own, never by the event loop.

A log line is written to stdout or stderr, and when that is a pipe whose reader stops reading (a
server started from a notebook with ``subprocess.Popen(..., stdout=PIPE)`` and never read, a
stalled log collector), the write blocks once the pipe's buffer is full (64 KiB on Linux: about
a thousand access-log lines); a terminal blocks it after Ctrl-S. Written from the event loop,
that stopped the whole server: every request waited for the reader. So ``headscope serve`` hands
its records to a bounded queue (:func:`install`): the loggers' handlers are kept, and called by
one writer thread.

* A record is handed over without being formatted (the writer formats it with the handler's own
  formatter: uvicorn's access lines read their ``args``).
* When the queue is full (the reader has stopped), records are dropped and counted, and a line
  written before the next record, once the writer can write again, says how many were lost (to
  the root logger's handlers: stderr).
* The writer writes to a stream's file descriptor directly, holding no lock of the handler or of
  the stream, so a writer blocked on a full pipe cannot block anything else: logging's own
  shutdown, Python's flush of stdout at exit, a stop (:meth:`LogWriter.stop` gives up after its
  timeout and leaves the thread, a daemon, blocked).
"""

from __future__ import annotations

import io
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Sequence

# Records waiting for the writer; past this the newest are dropped (about 10 MB at most).
QUEUE_RECORDS = 10_000
DROPPED_NOTICE = "%d log record(s) were dropped: the log's reader did not read them in time"
# The most records written in one go (what queued up while the writer wrote the last ones).
BATCH_RECORDS = 256

# What the writer is handed: a record with its handlers; an Event, set once everything before it
# is written (flush); None, the end.
Item = tuple[logging.LogRecord, tuple[logging.Handler, ...]] | threading.Event | None


class _Enqueue(logging.Handler):
    """A logger's one handler: hands each record, with the handlers it was meant for, to the
    writer."""

    def __init__(self, writer: LogWriter, targets: Sequence[logging.Handler]):
        super().__init__()
        self.writer = writer
        self.targets = tuple(targets)

    def handle(self, record: logging.LogRecord) -> bool:
        # No lock, no formatting: the writer does both (the base class takes the handler's lock).
        self.writer.put(record, self.targets)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # handle() does it all
        self.writer.put(record, self.targets)


class LogWriter:
    """One thread that writes the records of the loggers :func:`install` took over.

    Args:
        capacity: records that may wait for it; more are dropped and counted.
    """

    def __init__(self, capacity: int = QUEUE_RECORDS):
        self._queue: queue.Queue[Item] = queue.Queue(capacity)
        self._lock = threading.Lock()
        self._dropped = 0  # since the last notice
        self.dropped_total = 0
        self.on_drop: Callable[[], None] | None = None  # called for each record dropped (a metric)
        self.loggers: list[tuple[logging.Logger, list[logging.Handler], _Enqueue]] = []
        # Where the notice of dropped records goes: the first logger's handlers (the root's when it
        # has any), not an access log's, whose formatter reads a request's fields.
        self.notice_targets: tuple[logging.Handler, ...] = ()
        self._thread = threading.Thread(target=self._run, name="headscope-log-writer", daemon=True)

    def put(self, record: logging.LogRecord, targets: tuple[logging.Handler, ...]) -> None:
        try:
            self._queue.put_nowait((record, targets))
        except queue.Full:
            with self._lock:
                self._dropped += 1
                self.dropped_total += 1
            if self.on_drop is not None:
                self.on_drop()

    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout: float) -> bool:
        """Wait until the records queued so far have been written; False after ``timeout`` seconds."""
        reached = threading.Event()
        try:
            self._queue.put(reached, timeout=timeout)
        except queue.Full:
            return False
        return reached.wait(timeout)

    def stop(self, timeout: float = 2.0) -> bool:
        """Write what is queued, within ``timeout`` seconds, then give the loggers their handlers
        back. Returns False when the writer is still blocked (its reader reads nothing): it is
        left behind, a daemon, with the loggers still handing it records (dropped once its queue
        is full), so that nothing logged afterwards blocks either."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        for logger, handlers, ours in self.loggers:
            logger.removeHandler(ours)
            for h in handlers:
                logger.addHandler(h)
        self.loggers.clear()
        rest: list[Item] = []
        while True:  # records queued behind the end: written here, the writer is gone
            try:
                rest.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._write_all(rest)
        return True

    def _run(self) -> None:
        while True:
            # What has queued up meanwhile is written with it: one write a stream, not one a line.
            items = [self._queue.get()]
            while len(items) < BATCH_RECORDS and items[-1] is not None:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write_all(items)
            if items[-1] is None:
                return

    def _write_all(self, items: list[Item]) -> None:
        """Write ``items`` in order: the text of each stream's records in one write, flushed
        before an Event (a :meth:`flush`) is set."""
        pending: dict[int, tuple[logging.Handler, logging.LogRecord, list[bytes]]] = {}
        for item in items:
            if item is None:
                break
            if isinstance(item, threading.Event):
                self._send(pending)
                item.set()
                continue
            record, targets = item
            with self._lock:
                dropped, self._dropped = self._dropped, 0
            if dropped:
                notice = logging.LogRecord("headscope", logging.WARNING, __file__, 0, DROPPED_NOTICE, (dropped,), None)
                self._format(notice, self.notice_targets or targets, pending)
            self._format(record, targets, pending)
        self._send(pending)

    @staticmethod
    def _format(
        record: logging.LogRecord,
        targets: Iterable[logging.Handler],
        pending: dict[int, tuple[logging.Handler, logging.LogRecord, list[bytes]]],
    ) -> None:
        for h in targets:
            if record.levelno < h.level or not h.filter(record):
                continue
            fd = _fileno(h)
            if fd is None:  # not a file (a test's StringIO): the handler as it is; it cannot block
                h.handle(record)
                continue
            try:
                text = h.format(record) + getattr(h, "terminator", "\n")
                data = text.encode(getattr(h.stream, "encoding", None) or "utf-8", "backslashreplace")  # type: ignore[attr-defined]
            except Exception:  # a broken formatter: as logging itself does
                h.handleError(record)
                continue
            pending.setdefault(fd, (h, record, []))[2].append(data)

    @staticmethod
    def _send(pending: dict[int, tuple[logging.Handler, logging.LogRecord, list[bytes]]]) -> None:
        for fd, (h, record, parts) in pending.items():
            view = memoryview(b"".join(parts))
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:  # a closed pipe: as logging itself does (once for the batch)
                h.handleError(record)
        pending.clear()


def _fileno(h: logging.Handler) -> int | None:
    """The file descriptor a stream handler writes to, or None."""
    stream = getattr(h, "stream", None)
    if stream is None:
        return None
    try:
        fd = stream.fileno()
        if os.name == "nt" and stream.isatty():  # a Windows console takes text in its own encoding
            return None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return fd


def install(loggers: Iterable[logging.Logger] | None = None, capacity: int = QUEUE_RECORDS) -> LogWriter:
    """Give every logger that has handlers (the root's, uvicorn's, ``loggers`` when given) one
    handler that queues its records for a :class:`LogWriter`, and start the writer.

    Call it after logging is configured (``uvicorn.Config`` configures uvicorn's loggers), and
    :meth:`LogWriter.stop` when serving is over.
    """
    if loggers is None:
        known = [x for x in logging.root.manager.loggerDict.values() if isinstance(x, logging.Logger)]
        loggers = [logging.getLogger(), *known]
    writer = LogWriter(capacity)
    for logger in loggers:
        handlers = list(logger.handlers)
        if not handlers:
            continue
        for h in handlers:
            flush = getattr(h, "flush", None)
            if flush is not None:
                flush()  # what the stream had buffered goes out before the writer's lines
            logger.removeHandler(h)
        ours = _Enqueue(writer, handlers)
        logger.addHandler(ours)
        writer.loggers.append((logger, handlers, ours))
        writer.notice_targets = writer.notice_targets or ours.targets
    writer.start()
    return writer
