"""Turn a publisher spec from the command line (``--publisher``) into a publisher.

Accepted forms:

``stdout``
    :class:`~sqla_outbox.publishers.stdout.StdoutPublisher`, one JSON object per line.
``module:attribute``
    Import ``module`` and take ``attribute`` (dots allowed: ``myapp.jobs:outbox.publisher``).
    An object with a ``publish`` method is used as is, a class is instantiated with no
    arguments, and any other callable is used as the publish function.
A broker URL (``redis://``, ``amqp://``, ``nats://``, ``kafka://``, ``http(s)://``, ``celery:...``)
    The scheme picks a module in :data:`~sqla_outbox.publishers.schemes.BROKERS`, imported only
    now, whose ``from_url(url)`` builds the publisher. Checked before the ``module:attribute``
    split (``redis://host`` has a colon too). A missing client library is reported with the
    ``pip install "sqla-outbox[<extra>]"`` line that fixes it.

Every failure raises :class:`~sqla_outbox.errors.PublisherError` carrying the spec and the fix,
never a bare ``ImportError``: the CLI prints it as one line, and an operator misspelling a module
name should not have to read a traceback from ``importlib``.

This module does not touch ``sys.path``. The CLI puts the working directory on it first, as
``python -m`` and most application servers do, so ``myapp.publishers:publish`` resolves from the
project directory.
"""

from __future__ import annotations

import importlib
import re

from sqla_outbox.errors import PublisherError
from sqla_outbox.publishers import PublisherLike
from sqla_outbox.publishers.schemes import BROKERS
from sqla_outbox.publishers.stdout import StdoutPublisher
from sqla_outbox.publishers.urls import hide_password

__all__ = ["import_module", "resolve_attribute", "resolve_publisher"]

ACCEPTED_FORMS = "'stdout' or 'module:attribute' (e.g. 'myapp.publishers:publish')"

# ``scheme://...`` is a URL; so is ``celery:...`` (Celery app paths have no ``//``). A module
# path never contains ``//``, so this cannot swallow a ``module:attribute`` spec, except for a
# module literally named ``celery``, which would shadow the Celery library anyway.
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://|^(?P<celery>celery):", re.IGNORECASE)
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def resolve_publisher(spec: str) -> PublisherLike:
    """The publisher ``spec`` names (see the module docs), or :class:`PublisherError`."""
    if not isinstance(spec, str):
        raise PublisherError(f"A publisher spec must be a string, got {spec!r}.")
    text = spec.strip()
    if text == "stdout":
        return StdoutPublisher()
    url = _URL.match(text)
    if url:
        scheme = (url.group("scheme") or url.group("celery")).lower()
        return _broker_publisher(scheme, text)
    module_name, colon, attribute = text.partition(":")
    if not colon:
        raise PublisherError(
            f"Publisher spec {spec!r} is not one of the accepted forms: {ACCEPTED_FORMS}."
        )
    if not _DOTTED_NAME.match(module_name) or not _DOTTED_NAME.match(attribute):
        raise PublisherError(
            f"Publisher spec {spec!r} does not name a module and an attribute; use "
            f"{ACCEPTED_FORMS}, with dotted Python names on both sides of the colon."
        )
    source = f"publisher spec {spec!r}"
    fix = (
        "check the name after the colon: it must name a publisher object, class or function "
        "defined in that module"
    )
    module = import_module(module_name, source)
    target = resolve_attribute(module, module_name, attribute, source, fix)
    return _as_publisher(target, spec)


def _broker_publisher(scheme: str, url: str) -> PublisherLike:
    broker = BROKERS.get(scheme)
    shown = hide_password(url)
    if broker is None:
        raise PublisherError(
            f"Publisher {shown!r} has the unknown scheme {scheme!r}; use {ACCEPTED_FORMS}, or a "
            f"broker URL with one of the schemes {', '.join(sorted(BROKERS))}."
        )
    from_url = getattr(importlib.import_module(broker.module), "from_url")  # noqa: B009
    try:
        publisher: PublisherLike = from_url(url)
    except PublisherError:
        raise
    except Exception as error:
        raise PublisherError(
            f"Could not create the {scheme} publisher for {shown!r}: "
            f"{type(error).__name__}: {error}. Check the URL against its broker's page of the "
            "documentation."
        ) from error
    return publisher


def import_module(name: str, source: str) -> object:
    """Import module ``name``, which ``source`` names (e.g. ``"publisher spec 'x:y'"``).

    Any failure is a :class:`PublisherError` saying which module, why, and what to do; a module
    that imports but is missing a dependency is told apart from one that does not exist.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing == name or name.startswith(f"{missing}."):
            raise PublisherError(
                f"Cannot import module {name!r} named by {source}: {error}. Check the "
                "spelling, run from the project directory or add it to PYTHONPATH, or install "
                "the package that provides it."
            ) from error
        raise PublisherError(
            f"Importing module {name!r} for {source} failed because {missing!r} is not "
            f"installed. Install it (pip install {missing.split('.')[0]}) in this environment."
        ) from error
    except Exception as error:
        raise PublisherError(
            f"Importing module {name!r} for {source} raised {type(error).__name__}: {error}. "
            f"Fix the module; python -c 'import {name}' shows the traceback."
        ) from error


def resolve_attribute(
    module: object, module_name: str, attribute: str, source: str, fix: str
) -> object:
    """``module``'s ``attribute`` (dots allowed), or a :class:`PublisherError` ending in ``fix``."""
    target = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as error:
            raise PublisherError(
                f"Module {module_name!r} has no attribute {attribute!r} (from {source}); {fix}."
            ) from error
    return target


def _as_publisher(target: object, spec: str) -> PublisherLike:
    if isinstance(target, type):
        # A class: the instance is the publisher. Checked before ``publish`` because a class
        # whose instances publish has a ``publish`` attribute too (the unbound function).
        try:
            target = target()
        except Exception as error:
            raise PublisherError(
                f"Publisher class {spec!r} could not be instantiated with no arguments: "
                f"{type(error).__name__}: {error}. Give its parameters defaults, or point the "
                "spec at a ready instance or a factory function's result instead."
            ) from error
    if callable(getattr(target, "publish", None)) or callable(target):
        return target  # type: ignore[return-value]
    raise PublisherError(
        f"Publisher spec {spec!r} names {target!r}, which is neither an object with a "
        "publish(message) method, nor a class, nor a callable taking one message; point it at "
        "one of those."
    )
