"""FastAPI with sqla-outbox: enqueue from an ``AsyncSession``, run the relay in the lifespan.

    pip install sqla-outbox fastapi uvicorn
    DATABASE_URL=postgresql+psycopg://app@db/app uvicorn fastapi_app:app --app-dir examples

``POST /orders {"email": "ada@example.com"}`` commits an order and its ``send_receipt`` job in one
transaction; the relay, started when the app starts and stopped when it shuts down, prints the
job once it is committed. ``GET /healthz`` answers 503 while the relay is not reaching the
database. docs/recipes/fastapi.md explains each step.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import sqla_outbox as outbox


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fastapi_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(200))


class OrderIn(BaseModel):
    email: str


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One ``AsyncSession`` per request, from the app's session factory."""
    async with request.app.state.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def print_message(message: outbox.OutboxMessage) -> None:
    """The publisher: hand the message to your broker here (raising means "not published")."""
    print(f"published {message.job} {message.input}", flush=True)


def create_app(
    database_url: str,
    publish: Callable[[outbox.OutboxMessage], None] = print_message,
) -> FastAPI:
    """The app on ``database_url``, a ``postgresql+psycopg://`` URL.

    One URL serves both sides with psycopg 3: ``create_async_engine`` picks psycopg's asyncio
    driver for the app, and the relay, which runs in a thread, opens synchronous connections from
    the same URL. Give the relay a URL (or a synchronous ``Engine``), never the ``AsyncEngine``.
    """
    engine = create_async_engine(database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:  # in a real app: alembic upgrade head
            await conn.run_sync(Base.metadata.create_all)
            await conn.run_sync(outbox.metadata.create_all)
        relay = outbox.Relay(database_url, publish)
        relay.start()
        app.state.relay = relay
        try:
            yield
        finally:
            # stop() blocks until the pass in flight has written its marks: keep it off the
            # event loop so requests still being answered are not frozen meanwhile.
            await asyncio.to_thread(relay.stop)
            await engine.dispose()

    app = FastAPI(lifespan=lifespan)
    # expire_on_commit=False: reading order.id after commit must not trigger a lazy load.
    app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)

    @app.post("/orders", status_code=201)
    async def place_order(order_in: OrderIn, session: SessionDep) -> dict[str, int]:
        order = Order(email=order_in.email)
        session.add(order)
        await session.flush()  # runs the INSERT, so order.id is set (it is None before)
        outbox.enqueue(session, "send_receipt", {"order_id": order.id}, queue="emails")
        await session.commit()  # the order and its job commit together, or neither does
        return {"id": order.id}

    @app.get("/healthz")
    def healthz(response: Response) -> dict[str, bool]:
        alive = app.state.relay.is_alive()
        if not alive:
            response.status_code = 503
        return {"relay": alive}

    return app


app = create_app(os.environ.get("DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"))
