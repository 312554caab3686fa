"""The relay's rule for telling an outage from a message failure, as the broker tests check it.

Written out here rather than imported from the library, so the tests pin the contract a relay
reads (``docs/publishers.md``), not whatever the publishers' own code believes it to be.
"""

from __future__ import annotations

from sqla_outbox.errors import BrokerUnavailableError


def is_outage(error: BaseException) -> bool:
    """Whether the relay treats ``error`` as an outage: no attempt charged, the relay backs off."""
    return isinstance(error, BrokerUnavailableError) or isinstance(
        error.__cause__, BrokerUnavailableError
    )


def confirmed(error: BaseException) -> int:
    """How many messages of a batch ``error`` says were confirmed (its ``published``)."""
    published = getattr(error, "published", 0)
    assert isinstance(published, int), f"{error!r} has published={published!r}"
    return published
