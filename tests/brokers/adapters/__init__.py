"""One adapter per broker, found by looking: every module here that defines ``ADAPTER``.

Adding a broker to the conformance suite is adding a module to this package (named after the
publisher module, ``kafka.py`` for ``sqla_outbox.publishers.kafka``) with ``ADAPTER = ...``, an
instance of :class:`~brokers.conformance.BrokerAdapter`; nothing else is edited. A module that
cannot be imported because its broker's client library is missing becomes a
:class:`~brokers.conformance.MissingAdapter`, so that broker's scenarios skip saying so instead
of the whole suite failing to load; any other import error is raised.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from ..conformance import BrokerAdapter, MissingAdapter

_OURS = {"sqla_outbox", "brokers", "support"}


def _discover() -> list[BrokerAdapter]:
    found: list[BrokerAdapter] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except ModuleNotFoundError as error:
            if (error.name or "").partition(".")[0] in _OURS:
                raise  # a mistake in the adapter or the library, not a missing client
            reason = f"the {info.name} adapter needs {error.name!r}, which is not installed"
            found.append(MissingAdapter(info.name, reason))
            continue
        except pytest.skip.Exception as skipped:  # a fixture module's importorskip
            found.append(MissingAdapter(info.name, str(skipped)))
            continue
        adapter = getattr(module, "ADAPTER", None)
        if adapter is not None:
            found.append(adapter)
    return found


ADAPTERS: list[BrokerAdapter] = _discover()
"""Every broker the conformance suite runs against, by module name."""
