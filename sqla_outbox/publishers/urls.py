"""What the broker publishers share: URLs shown without their password, options read from a URL's
query, option values checked, and a missing client library reported with its install line.

Every check raises :class:`~sqla_outbox.errors.PublisherError` with one sentence that names the
broker (``label``, e.g. ``"RabbitMQ URL"``), the offending value and the fix, so the messages are
as specific as if each broker had written them itself, and every broker words the same mistake
the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator
from urllib.parse import SplitResult, parse_qsl, urlsplit, urlunsplit

from sqla_outbox.errors import PublisherError
from sqla_outbox.publishers.schemes import BROKERS

__all__ = [
    "UNPARSEABLE",
    "check_scheme",
    "checked_options",
    "hide_password",
    "parse_seconds",
    "positive_seconds",
    "query_options",
    "require_client",
    "split_options",
    "split_publisher_url",
    "split_url",
    "unknown_option",
]

UNPARSEABLE = "<unparseable URL>"
"""What :func:`hide_password` shows for a URL it cannot take apart."""


def hide_password(url: str, *, limit: int | None = None) -> str:
    """``url`` with its password replaced by ``***``, for logs and errors.

    :param limit: cut the result to this many characters (a webhook URL can be long).
    """
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
            url = urlunsplit(parts._replace(netloc=netloc))
        return url if limit is None else url[:limit]
    except (ValueError, TypeError, AttributeError):
        return UNPARSEABLE


def require_client(installed: bool, what: str, scheme: str) -> None:
    """Raise unless ``installed``: ``what`` needs the client of ``scheme``'s broker, and how to
    install it (its :data:`~sqla_outbox.publishers.schemes.BROKERS` entry)."""
    if not installed:
        broker = BROKERS[scheme]
        raise PublisherError(f"{what} needs the {broker.client} client: {broker.install}.")


# -- the URL itself ----------------------------------------------------------------------------


def split_url(
    url: str,
    *,
    label: str,
    example: str,
    schemes: tuple[str, str] | None = None,
    limit: int | None = None,
) -> tuple[SplitResult, str]:
    """``url`` split, with its port checked (and its scheme, if ``schemes`` is given), and the
    URL as errors show it (:func:`hide_password`).

    :param example: what to write instead, completing "use ...".
    """
    shown = hide_password(url, limit=limit)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is what validates it
    except ValueError as error:
        raise PublisherError(f"{label} {shown!r} is malformed ({error}); use {example}.") from error
    if schemes is not None:
        check_scheme(parts, schemes, label=label, shown=shown)
    return parts, shown


def split_publisher_url(url: object, *, label: str, example: str) -> tuple[SplitResult, str]:
    """The URL a ``from_url`` was given, split so its query (the options) can be read, and as
    errors show it. The server part is checked later, by the publisher's constructor."""
    if not isinstance(url, str):
        raise PublisherError(f"A {label} must be a string, got {url!r}.")
    shown = hide_password(url)
    try:
        parts = urlsplit(url.strip())
    except ValueError as error:
        raise PublisherError(
            f"{label} {shown!r} cannot be parsed ({error}); use {example}."
        ) from error
    return parts, shown


def check_scheme(parts: SplitResult, schemes: tuple[str, str], *, label: str, shown: str) -> None:
    """Raise unless the URL's scheme is one of ``schemes``: the plain one, then the TLS one."""
    if parts.scheme.lower() not in schemes:
        plain, tls = schemes
        raise PublisherError(
            f"{label} {shown!r} has scheme {parts.scheme!r}; use {plain}:// or {tls}:// (TLS)."
        )


# -- options in the query ----------------------------------------------------------------------


def _twice(label: str, shown: str, name: str) -> PublisherError:
    return PublisherError(f"{label} {shown!r} sets option {name!r} twice; give it once.")


def unknown_option(label: str, shown: str, name: str, known: Iterable[str]) -> PublisherError:
    """The error for an option the broker does not have, listing the ones it has."""
    return PublisherError(
        f"{label} {shown!r} has unknown option {name!r}; the options are {', '.join(known)}."
    )


def checked_options(
    pairs: Iterable[tuple[str, str]],
    *,
    label: str,
    shown: str,
    known: Collection[str] | None = None,
) -> Iterator[tuple[str, str]]:
    """``pairs`` (decoded query parameters) in order, each name at most once and, if ``known``
    is given, one of those.

    A generator, so a caller converting each value as it comes reports the first problem in the
    query, whichever kind it is.
    """
    seen: set[str] = set()
    for name, value in pairs:
        if name in seen:
            raise _twice(label, shown, name)
        if known is not None and name not in known:
            raise unknown_option(label, shown, name, known)
        seen.add(name)
        yield name, value


def query_options(
    query: str, *, label: str, shown: str, known: Collection[str] | None = None
) -> dict[str, str]:
    """Every parameter of ``query``, decoded, as checked by :func:`checked_options`."""
    pairs = parse_qsl(query, keep_blank_values=True)
    return dict(checked_options(pairs, label=label, shown=shown, known=known))


def split_options(
    parts: SplitResult, names: Collection[str], *, label: str, shown: str
) -> tuple[dict[str, str], str]:
    """The options among ``names`` in the URL's query (decoded, each at most once), and the URL
    with exactly those removed.

    The raw query is split rather than decoded and re-encoded, so every other parameter stays in
    the URL byte for byte as the user wrote it (for the endpoint, or the client library).
    """
    own: dict[str, str] = {}
    kept: list[str] = []
    for pair in parts.query.split("&") if parts.query else []:
        decoded = parse_qsl(pair, keep_blank_values=True)
        name = decoded[0][0] if decoded else pair
        if name in names:
            if name in own:
                raise _twice(label, shown, name)
            own[name] = decoded[0][1]
        else:
            kept.append(pair)
    return own, urlunsplit(parts._replace(query="&".join(kept)))


# -- option values -----------------------------------------------------------------------------


def parse_seconds(name: str, text: str | None, *, default: float, label: str, shown: str) -> float:
    """A URL option's text as a number of seconds, or ``default`` when it is absent.

    Only the syntax is checked here; the value is checked by :func:`positive_seconds`.
    """
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise PublisherError(
            f"{label} {shown!r} has {name}={text!r}, which is not a number of seconds; "
            f"use e.g. {name}={default:g}, or leave it out for {default:g}."
        ) from None


def positive_seconds(
    name: str,
    value: object,
    *,
    default: float,
    label: str | None = None,
    shown: str | None = None,
    coerce: bool = False,
) -> float:
    """``value`` as a positive, finite number of seconds, or a :class:`PublisherError`.

    :param default: what leaving the option out gives, for the message.
    :param label: the broker, when the message should name it (``"Webhook"``).
    :param shown: the publisher URL, when the message should quote it.
    :param coerce: accept anything ``float()`` accepts (text from a URL, a ``Decimal``), not only
        ``int`` and ``float``. ``True``/``False`` are never a number of seconds.
    """
    seconds = value
    if coerce and not isinstance(value, bool):
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            seconds = math.nan
    if (
        isinstance(value, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        option = f"{label} option {name}" if label else name
        publisher = f" (publisher {shown!r})" if shown is not None else ""
        raise PublisherError(
            f"{option} must be a positive, finite number of seconds, got {value!r}{publisher}; "
            f"use e.g. {name}={default:g}, or leave it out for {default:g}."
        )
    return float(seconds)
