"""The README's quickstart, runnable: stage jobs with orders, roll one back, relay the rest.

python examples/quickstart.py                # an SQLite file in a temp dir
python examples/quickstart.py postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sqla_outbox as outbox


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "quickstart_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


def main(url: str) -> None:
    engine = outbox.create_engine(url)  # on SQLite: real transactions and savepoints
    Base.metadata.create_all(engine)
    outbox.metadata.create_all(engine)  # in an app: a migration, op.create_outbox_table(version=5)

    with Session(engine) as session:
        order = Order(email="ada@example.com")
        session.add(order)
        session.flush()  # runs the INSERT, so order.id is set: before it, it is None
        outbox.enqueue(session, "send_receipt", {"order_id": order.id}, queue="emails")
        session.commit()  # the order and its job commit together

    with Session(engine) as session:
        session.add(Order(email="bob@example.com"))
        outbox.enqueue(session, "send_receipt", {"order_id": "never"}, queue="emails")
        session.rollback()  # ... or neither does

    def publish(message: outbox.OutboxMessage) -> None:
        print(f"published {message.job} {message.input} key={message.idempotency_key}")

    with outbox.Relay(engine, publish) as relay:
        relay.drain()
        print(f"pending after drain: {relay.pending()}")
    engine.dispose()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(f"sqlite:///{Path(tmp) / 'quickstart.sqlite3'}")
