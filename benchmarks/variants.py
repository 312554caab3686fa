"""The relay with one of PostgreSQL's claim variants turned off: what each variant buys.

The PostgreSQL store keeps two forms beside the planned claim every store runs
(:mod:`sqla_outbox.stores.base`): the one-statement claim while nothing is held back
(:func:`sqla_outbox.queries.fast_claim_stmt`), and a failed pass's write-back as one statement
(:func:`sqla_outbox.queries.settle_stmt`). A variant stays only while the suite shows it pays;
these arms are how it shows it. Each turns the variant off on one relay's store and nothing
else, so the arm and ``ours`` differ only there.
"""

from __future__ import annotations

from typing import Any

import sqla_outbox as outbox
from sqla_outbox.claims import Claimed, WriteBack
from sqla_outbox.stores import PostgresStore, SqlStore

__all__ = ["PlannedOnly", "WriteInSteps"]


def _store(relay: outbox.Relay) -> PostgresStore:
    store = relay._statements
    if not isinstance(store, PostgresStore):
        raise RuntimeError(f"the variants are PostgreSQL's; this relay's store is {store!r}")
    return store


class PlannedOnly(outbox.Relay):
    """A relay whose every claim is the planned one: the one-statement claim turned off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = _store(self)
        claim_once = store._claim_once

        def planned(token: str, carried: WriteBack | None) -> Claimed:
            store._crowded = True
            return claim_once(token, carried)

        store._claim_once = planned  # type: ignore[method-assign]


class WriteInSteps(outbox.Relay):
    """A relay whose failed passes write back in one statement per step (mark, charge, each
    release) in one transaction, as the other stores do: the one-statement write-back turned
    off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        store = _store(self)
        write = store.write

        def in_steps(write_back: WriteBack) -> None:
            if write_back.mark_only:
                write(write_back)
                return
            with store._transaction(statements=2) as conn:
                SqlStore._write_in_steps(store, conn, write_back)

        store.write = in_steps  # type: ignore[method-assign]
