"""The ``kafka://`` URL of the CLI's ``--publisher``: parsed and checked into the arguments of
:class:`~sqla_outbox.publishers.kafka.KafkaPublisher`.

Kept apart from the publisher so it imports without ``confluent-kafka``: every option is checked,
and a mistake named with its fix, before any client is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict
from urllib.parse import SplitResult, unquote

from sqla_outbox.errors import PublisherError
from sqla_outbox.publishers.urls import (
    parse_seconds,
    positive_seconds,
    query_options,
    split_publisher_url,
    unknown_option,
)

__all__ = [
    "DEFAULT_DELIVERY_TIMEOUT",
    "DEFAULT_PORT",
    "QUEUE_PLACEHOLDER",
    "PublisherArguments",
    "publisher_arguments",
]

DEFAULT_DELIVERY_TIMEOUT = 10.0
"""Seconds a message has to be confirmed before its publish fails (``delivery_timeout``).

librdkafka's own default (``message.timeout.ms``) is 300 s, which would hold a relay's pass,
and its ``stop()``, for five minutes whenever the cluster is unreachable.
"""

DEFAULT_PORT = 9092
"""The port of a broker address given without one."""

QUEUE_PLACEHOLDER = "{queue}"

_LABEL = "Kafka publisher URL"
_EXAMPLE = "kafka://host:9092?topic={queue}"
_SCHEMES = ("kafka",)
_OPTIONS = (
    "topic",
    "delivery_timeout",
    "linger_ms",
    "compression",
    "message_max_bytes",
    "auto_create_topics",
    "client_id",
    "security_protocol",
    "sasl_mechanism",
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
)
_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_TLS_OPTIONS = ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_LINGER_MS_MAX = 900_000  # librdkafka's bound on linger.ms
_MESSAGE_MAX_BYTES = (1000, 1_000_000_000)  # librdkafka's bounds on message.max.bytes


class PublisherArguments(TypedDict):
    """What a ``kafka://`` URL says, as :class:`~sqla_outbox.publishers.kafka.KafkaPublisher`
    takes it."""

    bootstrap_servers: str
    topic: str
    delivery_timeout: float
    config: dict[str, object]
    shown: str


def publisher_arguments(url: str) -> PublisherArguments:
    """The publisher's arguments for ``url`` (the forms and options: :func:`~sqla_outbox.
    publishers.kafka.from_url`); :class:`PublisherError` naming the first thing wrong."""
    parts, shown = split_publisher_url(url, label=_LABEL, example=_EXAMPLE)
    if parts.scheme.lower() not in _SCHEMES:
        raise PublisherError(f"{_LABEL} {shown!r} has scheme {parts.scheme!r}; use {_EXAMPLE}.")
    if parts.path not in ("", "/") or parts.fragment:
        raise PublisherError(
            f"{_LABEL} {shown!r} has a path or fragment, which Kafka has no use for; name the "
            f"topic with the topic option, as in {_EXAMPLE}."
        )
    options = query_options(parts.query, label=_LABEL, shown=shown)
    for name in options:
        if name not in _OPTIONS:
            raise unknown_option(_LABEL, shown, name, _OPTIONS)
    servers, user, password = _split_netloc(parts, shown)
    config = _client_options(options, shown)
    config.update(_security(options, user, password, shown))
    timeout = positive_seconds(
        "delivery_timeout",
        parse_seconds(
            "delivery_timeout",
            options.get("delivery_timeout"),
            default=DEFAULT_DELIVERY_TIMEOUT,
            label=_LABEL,
            shown=shown,
        ),
        default=DEFAULT_DELIVERY_TIMEOUT,
        label="Kafka",
        shown=shown,
    )
    return {
        "bootstrap_servers": servers,
        "topic": options.get("topic", QUEUE_PLACEHOLDER),
        "delivery_timeout": timeout,
        "config": config,
        "shown": shown,
    }


def _split_netloc(parts: SplitResult, shown: str) -> tuple[str, str | None, str | None]:
    """The bootstrap servers (``host:port,...``, ports defaulted), user and password."""
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user = password = None
    if at:
        name, colon, secret = userinfo.partition(":")
        user = unquote(name)
        password = unquote(secret) if colon else None
        if not user or not password:
            raise PublisherError(
                f"{_LABEL} {shown!r} has credentials without both a user and a password; use "
                "kafka://user:password@host:9092, or leave both out."
            )
    servers = []
    for address in hosts.split(","):
        host, port = _split_address(address.strip(), shown)
        servers.append(f"{host}:{port}")
    return ",".join(servers), user, password


def _split_address(address: str, shown: str) -> tuple[str, int]:
    if address.startswith("["):  # [IPv6]:port
        host, bracket, rest = address[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            host = ""
        host, port_text = f"[{host}]" if host else "", rest[1:] if rest else ""
    else:
        host, _colon, port_text = address.partition(":")
    if not host:
        raise PublisherError(
            f"{_LABEL} {shown!r} has a broker address {address!r} with no host; list brokers "
            "as host:port separated by commas, as in kafka://b1:9092,b2:9092."
        )
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise PublisherError(
            f"{_LABEL} {shown!r} has a broker address {address!r} whose port is not a number "
            "from 1 to 65535; use e.g. kafka://broker:9092."
        )
    return host, int(port_text)


def _client_options(options: Mapping[str, str], shown: str) -> dict[str, object]:
    """librdkafka settings for the options that tune the producer."""
    config: dict[str, object] = {}
    if "linger_ms" in options:
        config["linger.ms"] = _whole_number(options, "linger_ms", 0, _LINGER_MS_MAX, shown)
    if "message_max_bytes" in options:
        low, high = _MESSAGE_MAX_BYTES
        config["message.max.bytes"] = _whole_number(options, "message_max_bytes", low, high, shown)
    if "compression" in options:
        config["compression.type"] = _one_of(options, "compression", _COMPRESSIONS, shown)
    if "auto_create_topics" in options:
        text = options["auto_create_topics"].lower()
        if text not in _BOOLEANS:
            raise PublisherError(
                f"{_LABEL} {shown!r} has auto_create_topics={options['auto_create_topics']!r}; "
                "use true or false."
            )
        config["allow.auto.create.topics"] = _BOOLEANS[text]
    if "client_id" in options:
        if not options["client_id"]:
            raise PublisherError(
                f"{_LABEL} {shown!r} has an empty client_id; give one, or leave it out for "
                "sqla-outbox."
            )
        config["client.id"] = options["client_id"]
    return config


def _security(
    options: Mapping[str, str], user: str | None, password: str | None, shown: str
) -> dict[str, object]:
    """librdkafka settings for the protocol, the SASL credentials and the TLS files."""
    default = "sasl_ssl" if user is not None else "plaintext"
    protocol = (
        _one_of(options, "security_protocol", _PROTOCOLS, shown)
        if "security_protocol" in options
        else default
    )
    sasl = protocol.startswith("sasl_")
    if user is not None and not sasl:
        raise PublisherError(
            f"{_LABEL} {shown!r} has a user and password but security_protocol={protocol}, "
            "which would not send them; use sasl_ssl (or sasl_plaintext), or drop the "
            "credentials."
        )
    if sasl and user is None:
        raise PublisherError(
            f"{_LABEL} {shown!r} has security_protocol={protocol} but no credentials; put them "
            "in the URL as kafka://user:password@host:9092."
        )
    if "sasl_mechanism" in options and not sasl:
        raise PublisherError(
            f"{_LABEL} {shown!r} sets sasl_mechanism without SASL; add user:password@ to the "
            "URL, or drop the option."
        )
    tls = protocol in ("ssl", "sasl_ssl")
    for name in _TLS_OPTIONS:
        if name in options and not tls:
            raise PublisherError(
                f"{_LABEL} {shown!r} sets {name}, a TLS option, with security_protocol="
                f"{protocol}; use ssl or sasl_ssl for TLS, or drop the option."
            )
    config: dict[str, object] = {"security.protocol": protocol}
    if sasl:
        mechanism = options.get("sasl_mechanism", "PLAIN").upper()
        if mechanism not in _MECHANISMS:
            raise PublisherError(
                f"{_LABEL} {shown!r} has sasl_mechanism={options['sasl_mechanism']!r}; use one "
                f"of {', '.join(_MECHANISMS)}."
            )
        config.update({"sasl.mechanism": mechanism, "sasl.username": user})
        config["sasl.password"] = password
    for name in _TLS_OPTIONS:
        if name in options:
            config[name.replace("_", ".")] = options[name]
    return config


def _whole_number(options: Mapping[str, str], name: str, low: int, high: int, shown: str) -> int:
    text = options[name]
    if not text.isdigit() or not low <= int(text) <= high:
        raise PublisherError(
            f"{_LABEL} {shown!r} has {name}={text!r}; use a whole number from {low} to {high}, "
            "or leave it out."
        )
    return int(text)


def _one_of(options: Mapping[str, str], name: str, allowed: Sequence[str], shown: str) -> str:
    text = options[name]
    folded = text.upper() if allowed is _MECHANISMS else text.lower()
    if folded not in allowed:
        raise PublisherError(
            f"{_LABEL} {shown!r} has {name}={text!r}; use one of {', '.join(allowed)}."
        )
    return folded
