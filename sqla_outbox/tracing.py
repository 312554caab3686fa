"""The W3C ``traceparent`` of the span that is enqueuing, when there is one.

It is read at staging time, not at publish time: the relay runs later, in its own thread, with
no request span in scope, so a trace read there would belong to nobody. OpenTelemetry is
optional (``pip install "sqla-outbox[otel]"``). If the application never imported
``opentelemetry.trace`` it cannot have a recording span, so nothing is imported and an enqueue
pays nothing for tracing.
"""

from __future__ import annotations

import sys

__all__ = ["current_traceparent"]


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` header of the current recording span, else ``None``."""
    otel_trace = sys.modules.get("opentelemetry.trace")
    if otel_trace is None or not otel_trace.get_current_span().is_recording():
        return None
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415 - optional
        TraceContextTextMapPropagator,
    )

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")
