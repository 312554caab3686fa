"""Publish one claim in order, and sort what happened into what the relay must write back.

The claim arrives in claim order and already respects every promise across claims (see
:mod:`sqla_outbox.plan`); inside the pass the same promises hold:

* ``order="key"``: a failed message holds back only the later messages of its own transaction
  (its ``staged_at``) and of its ``ordering_key``; every other message of the claim is still
  published. The held-back ones are handed back uncharged and parked: the next claims pass
  them by (instead of filling every batch with them) until the failed message is published.
* ``order="strict"``: the first failure ends the pass and hands back everything after it.
* A broker **outage** (:func:`is_outage`) ends the pass and charges nobody: every message not yet
  confirmed is handed back, and the relay backs off as a whole.
* A graceful stop, or a claim whose lease was lost (:mod:`sqla_outbox.renewal`), ends the pass
  before the next message: nothing more of it is published.
* ``KeyboardInterrupt`` and ``SystemExit`` end the pass like a graceful stop and are re-raised
  by the relay once the pass is settled. Every other ``BaseException`` (an
  ``asyncio.CancelledError`` escaping a client) is a failed publish of that message.
* A publish that returns an awaitable has sent nothing (the relay never awaits): a failed
  publish of that message too (:func:`refuse_awaitable`).
* A message whose stored ``input`` Python cannot decode (a row written by hand:
  :class:`~sqla_outbox.coltypes.UndecodableInput`) is never given to the publisher: a failed
  publish of that message (:func:`undecodable_error`), charged and in time dead-lettered like
  any other, while the rest of the claim is published.

A batch publisher (``publish_batch``) gets the whole claim; a partial confirmation
(``error.published = k``) publishes the first ``k``, charges message ``k`` and, in key order,
sends what it did not hold back in another batch.
"""

from __future__ import annotations

import datetime as dt
import inspect
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqla_outbox.coltypes import UndecodableInput
from sqla_outbox.errors import BrokerUnavailableError
from sqla_outbox.message import OutboxMessage

__all__ = [
    "ENDS_PROCESS",
    "PassOutcome",
    "confirmed_count",
    "is_outage",
    "publish_claim",
    "refuse_awaitable",
    "undecodable_error",
]

ENDS_PROCESS = (KeyboardInterrupt, SystemExit)
"""What a publisher may raise that is not a failed publish but a request to stop."""


def is_outage(error: BaseException) -> bool:
    """The broker could not be reached: a :class:`BrokerUnavailableError`, or caused by one."""
    return isinstance(error, BrokerUnavailableError) or isinstance(
        error.__cause__, BrokerUnavailableError
    )


def confirmed_count(error: BaseException, sent: int) -> int:
    """How many messages of a batch of ``sent`` the error says went out, clamped to the batch."""
    published = getattr(error, "published", 0)
    if not isinstance(published, int) or isinstance(published, bool):
        return 0
    return max(0, min(published, sent))


@dataclass
class PassOutcome:
    """What publishing one claim came to; every claimed message is in exactly one list."""

    published: list[OutboxMessage] = field(default_factory=list)
    failed: list[tuple[OutboxMessage, BaseException]] = field(default_factory=list)
    """Messages the broker refused: each is charged an attempt."""
    handed_back: list[OutboxMessage] = field(default_factory=list)
    """Messages not published and not to blame: released at once, uncharged."""
    held_back: list[OutboxMessage] = field(default_factory=list)
    """Messages held back by a failure in this pass (order="key"): released uncharged and
    parked, so the next claims pass them by until the failed message is published."""
    waits_for: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    """Each held-back message's id -> the id of the failed message it waits for (through the
    messages between them): what it is parked behind."""
    outage: BaseException | None = None
    stop: BaseException | None = None
    """A ``KeyboardInterrupt``/``SystemExit`` to raise once the pass is settled."""

    @property
    def complete(self) -> bool:
        """Every message of the claim was published."""
        return not (self.failed or self.handed_back or self.held_back or self.outage or self.stop)

    def drop_frames(self) -> None:
        """Clear the local variables of the finished frames in the failures' and the outage's
        tracebacks; the relay calls it once the pass is done with them (observers included).

        Each traceback starts at the frame of this module that caught the error, whose
        locals hold this outcome, which holds the error: a reference cycle that kept every
        failing pass's claim (its messages and their payloads) alive until a garbage
        collection found it, and gave the collector most of its work in a drain with failures.
        The frames' ``f_back`` links lead on to the callers' frames, so the relay's pass also
        drops its own reference to the outcome before it returns. The tracebacks keep their
        files and line numbers and still format; only the locals of frames that have returned
        are gone. ``stop`` is left whole: it is raised.
        """
        errors = [error for _message, error in self.failed]
        if self.outage is not None:
            errors.append(self.outage)
        for error in errors:
            traceback.clear_frames(error.__traceback__)
            # Before Python 3.13, reading a frame's f_locals (as an error reporter that
            # captures local variables does) caches them in a dict on the frame, which clearing
            # the frame leaves in place; reading f_locals again refreshes it, empty.
            tb = error.__traceback__
            while tb is not None:
                tb.tb_frame.f_locals  # noqa: B018 - read for its effect on the cache
                tb = tb.tb_next


class _Holds:
    """The transactions and keys a failure in this pass holds back (order="key"), each with
    the failed message it waits for."""

    def __init__(self, outcome: PassOutcome) -> None:
        self.groups: dict[dt.datetime, uuid.UUID] = {}
        self.keys: dict[str, uuid.UUID] = {}
        self._outcome = outcome

    def failed(self, message: OutboxMessage) -> None:
        """``message`` failed: its transaction and key wait for it."""
        self._hold(message, message.id)

    def _hold(self, message: OutboxMessage, failed: uuid.UUID) -> None:
        self.groups.setdefault(message.staged_at, failed)
        if message.ordering_key is not None:
            self.keys.setdefault(message.ordering_key, failed)

    def hold_back(self, message: OutboxMessage) -> bool:
        """Hold ``message`` back if a failure holds its transaction or key (and then what
        waits for it in turn): whether it did."""
        failed = self.groups.get(message.staged_at)
        if failed is None and message.ordering_key is not None:
            failed = self.keys.get(message.ordering_key)
        if failed is None:
            return False
        self._hold(message, failed)
        self._outcome.held_back.append(message)
        self._outcome.waits_for[message.id] = failed
        return True


def publish_claim(
    messages: Sequence[OutboxMessage],
    publish: Callable[[OutboxMessage], object],
    publish_batch: Callable[[Sequence[OutboxMessage]], object] | None,
    *,
    strict: bool,
    should_stop: Callable[[], bool],
) -> PassOutcome:
    """Publish ``messages`` in order under the rules of the module documentation."""
    if publish_batch is not None:
        return _publish_batches(messages, publish_batch, strict=strict, should_stop=should_stop)
    outcome = PassOutcome()
    holds = _Holds(outcome)
    for index, message in enumerate(messages):
        if should_stop():
            outcome.handed_back.extend(messages[index:])
            break
        # What waits holds back what waits for it: its own transaction and key too.
        if holds.groups and holds.hold_back(message):
            continue
        try:
            if type(message.input) is UndecodableInput:  # a check, not a call: once a message
                raise undecodable_error(message)
            refuse_awaitable(publish(message))
        except BaseException as error:  # all of them: see the module documentation
            if isinstance(error, ENDS_PROCESS) or is_outage(error):
                outcome.handed_back.extend(messages[index:])
                _ended(outcome, error)
                break
            outcome.failed.append((message, error))
            if strict:
                outcome.handed_back.extend(messages[index + 1 :])
                break
            holds.failed(message)
            continue
        outcome.published.append(message)
    return outcome


def refuse_awaitable(sent: object) -> None:
    """Raise ``TypeError`` if a publish returned ``sent``, an awaitable: it has sent nothing.

    A publisher returning a coroutine (a ``lambda`` around an async client's ``publish``, an
    ``async def`` the relay could not recognise) has sent nothing: the relay never awaits. The
    message is charged as a failed publish, its ``last_error`` saying why, rather than marked
    published and lost. The coroutine is closed, so Python does not warn that it was never
    awaited.
    """
    if sent is None or not inspect.isawaitable(sent):
        return
    close = getattr(sent, "close", None)
    if callable(close):
        close()
    name = getattr(sent, "__qualname__", None)
    shown = type(sent).__name__ + (f" {name}()" if isinstance(name, str) else "")
    raise TypeError(
        f"the publisher returned {shown} instead of publishing: "
        "the relay calls it synchronously and never awaits, so nothing was sent. Make the "
        "publisher return once the broker has the message (the Publishers page of the "
        "documentation)."
    )


def undecodable_error(message: OutboxMessage) -> ValueError:
    """The refusal of ``message``, whose stored ``input`` could not be decoded (an
    :class:`~sqla_outbox.coltypes.UndecodableInput`), saying how to mend it.

    Publishing it would hand the broker text the job's consumer cannot read; refusing it makes
    it one row's failure, with the reason in its ``last_error``.
    """
    reason = getattr(message.input, "reason", "")
    return ValueError(
        f"message {message.id}'s stored input cannot be decoded ({reason}): it was not "
        "written by outbox.enqueue, which refuses such input. Correct the row's input, then "
        "retry it "
        f"(sqla-outbox dead retry {message.id}, once it is a dead letter)."
    )


def _send_decodable(
    publish_batch: Callable[[Sequence[OutboxMessage]], object], batch: Sequence[OutboxMessage]
) -> None:
    """``publish_batch(batch)``, except that a message whose ``input`` could not be decoded is
    not sent: what comes before it is, and then its refusal is raised as a partial confirmation
    of them (``published``), which blames it like a broker's refusal of that message would."""
    for index, message in enumerate(batch):
        if type(message.input) is UndecodableInput:
            if index:
                refuse_awaitable(publish_batch(batch[:index]))
            error = undecodable_error(message)
            error.published = index  # type: ignore[attr-defined]
            raise error
    refuse_awaitable(publish_batch(batch))


def _ended(outcome: PassOutcome, error: BaseException) -> None:
    if isinstance(error, ENDS_PROCESS):
        outcome.stop = error
    else:
        outcome.outage = error


def _publish_batches(
    messages: Sequence[OutboxMessage],
    publish_batch: Callable[[Sequence[OutboxMessage]], object],
    *,
    strict: bool,
    should_stop: Callable[[], bool],
) -> PassOutcome:
    outcome = PassOutcome()
    holds = _Holds(outcome)
    batch = list(messages)
    while batch:
        if should_stop():
            outcome.handed_back.extend(batch)
            break
        try:
            _send_decodable(publish_batch, batch)
        except BaseException as error:  # all of them: see the module documentation
            # Only what the error says was confirmed counts as published; anything else is
            # published again later (at least once), never lost.
            ended = isinstance(error, ENDS_PROCESS) or is_outage(error)
            confirmed = confirmed_count(error, len(batch) if ended else len(batch) - 1)
            outcome.published.extend(batch[:confirmed])
            if ended:
                outcome.handed_back.extend(batch[confirmed:])
                _ended(outcome, error)
                break
            failed = batch[confirmed]
            outcome.failed.append((failed, error))
            rest = batch[confirmed + 1 :]
            if strict:
                outcome.handed_back.extend(rest)
                break
            holds.failed(failed)
            batch = [message for message in rest if not holds.hold_back(message)]
            continue
        outcome.published.extend(batch)
        break
    return outcome
