"""``StdoutPublisher``: each message as one JSON object on one line of a text stream.

It is the publisher of ``sqla-outbox relay --publisher stdout`` and of the demo: no broker to
install, and the output pipes straight into ``jq``, a log shipper or a consumer script reading
lines. Every field of :meth:`OutboxMessage.to_dict` is written, ``max_attempts`` included, so
the line carries exactly what a broker publisher would send and nothing is lost between them.

The line is flushed before ``publish`` returns. Returning tells the relay "delivered", after
which the row is marked published; a line still sitting in a buffer when the process dies would
be marked and lost. A write that fails (a closed pipe) raises, so the row stays unpublished.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from sqla_outbox.message import OutboxMessage, compact_json

__all__ = ["StdoutPublisher", "message_line"]

# Several relays in one process (the demo) may share one stream: one lock for all publishers
# keeps each line whole instead of interleaving two messages' halves.
_WRITE_LOCK = threading.Lock()


def message_line(message: OutboxMessage) -> str:
    """``message`` as one line of compact JSON (no trailing newline), keys in field order.

    Non-ASCII text is kept as is rather than escaped: the stream is text, and a reader sees the
    customer's name, not ``\\u00e9``.
    """
    return compact_json(message.to_dict())


class StdoutPublisher:
    """Writes each message as one JSON line to ``stream`` (standard output by default).

    :param stream: a text stream; ``None`` means whatever ``sys.stdout`` is at publish time, so
        redirections made after construction (pytest's capture, ``contextlib.redirect_stdout``)
        are honoured.
    :param prefix: text written before the JSON on each line, to tell apart the relays that
        share one stream (the demo uses the relay id); empty by default so every line is JSON.
    """

    def __init__(self, stream: TextIO | None = None, *, prefix: str = "") -> None:
        self._stream = stream
        self.prefix = prefix

    def __repr__(self) -> str:
        name = "sys.stdout" if self._stream is None else repr(self._stream)
        return f"<StdoutPublisher to {name}>"

    def publish(self, message: OutboxMessage) -> None:
        """Write and flush one line; raise if the stream cannot take it (not published)."""
        stream = self._stream if self._stream is not None else sys.stdout
        line = f"{self.prefix}{message_line(message)}\n"
        with _WRITE_LOCK:
            stream.write(line)
            stream.flush()
