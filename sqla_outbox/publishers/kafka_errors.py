"""What a ``confluent_kafka.KafkaError`` means to the relay: an outage (nothing can be written
now, whatever the message), a refusal of one record, or a refusal of a whole produce batch; and
how a message names it with its fix.

Kept apart from the publisher because the sorting is the part a reader checks against the
Kafka protocol's error codes, table by table.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BATCH_REFUSALS",
    "OUTAGE_ERRORS",
    "broker_fix",
    "clean_text",
    "describe",
    "error_name",
    "kafka_error_of",
    "kafka_unavailable",
]

# Delivery and produce errors that say "nothing could be written now, whatever the message".
# librdkafka's local errors start with an underscore. Anything the client marks retriable, or
# fatal, is an outage too (see kafka_unavailable).
OUTAGE_ERRORS = frozenset(
    {
        "_MSG_TIMED_OUT",
        "_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_RESOLVE",
        "_AUTHENTICATION",
        "_SSL",
        "_FATAL",
        "_FENCED",
        "_DESTROY",
        "_PURGE_QUEUE",
        "_PURGE_INFLIGHT",
        "_NODE_UPDATE",
        "_WAIT_COORD",
        "BROKER_NOT_AVAILABLE",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "KAFKA_STORAGE_ERROR",
        "THROTTLING_QUOTA_EXCEEDED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "INVALID_PRODUCER_ID_MAPPING",
        "UNKNOWN_PRODUCER_ID",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "CLUSTER_AUTHORIZATION_FAILED",
        "SASL_AUTHENTICATION_FAILED",
        "ILLEGAL_SASL_STATE",
        "UNSUPPORTED_SASL_MECHANISM",
        "UNSUPPORTED_VERSION",
    }
)
# Refusals a broker gives a whole produce batch for one bad record in it (Kafka can name the
# record, KIP-467, and librdkafka then fails its batch-mates with _INVALID_DIFFERENT_RECORD;
# Tansu fails every record with the same code). Who is at fault is found by sending the records
# one at a time.
BATCH_REFUSALS = frozenset(
    {
        "INVALID_RECORD",
        "_INVALID_DIFFERENT_RECORD",
        "MSG_SIZE_TOO_LARGE",
        "RECORD_LIST_TOO_LARGE",
        "CORRUPT_MESSAGE",
        "INVALID_TIMESTAMP",
        "POLICY_VIOLATION",
    }
)


_TEXT_LIMIT = 300  # characters of a client error quoted in a message


def error_name(error: Any) -> str:
    """The error's code name (``NOT_ENOUGH_REPLICAS``): what the tables above are keyed on."""
    name: str = error.name()
    return name


def kafka_unavailable(error: Any) -> bool:
    """Whether ``error`` (a ``confluent_kafka.KafkaError`` from a delivery report or a
    ``produce()``, or ``None`` for a report that never came) means no message could be written
    now: an outage. False for a refusal of the message or its topic (see the module docs)."""
    if error is None:
        return True
    return bool(error_name(error) in OUTAGE_ERRORS or error.fatal() or error.retriable())


def kafka_error_of(error: BaseException) -> Any:
    """The ``KafkaError`` a ``KafkaException`` carries; None for any other error."""
    import confluent_kafka  # noqa: PLC0415 - only reached once the client produced an error

    if isinstance(error, confluent_kafka.KafkaException) and error.args:
        return error.args[0]
    return None


def clean_text(text: str) -> str:
    """A client error's text on one line, cut to a length a log line and a message keep."""
    text = " ".join(text.split()).rstrip(".")
    return text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."


def describe(error: Any) -> str:
    """How a message quotes ``error``: its code name and text for a Kafka error, else its type
    and text."""
    kafka_error = kafka_error_of(error) if isinstance(error, BaseException) else error
    if kafka_error is not None and hasattr(kafka_error, "name"):
        return f"{error_name(kafka_error)} ({clean_text(kafka_error.str())})"
    return f"{type(error).__name__}: {clean_text(str(error))}"


def broker_fix(error: Any, topic: str) -> str:
    """What an operator does about a refused record: the fix a dead letter's error names."""
    name = error_name(error)
    if name in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"):
        return f"create topic {topic!r} (or enable auto-creation) and the relay retries"
    if name == "TOPIC_AUTHORIZATION_FAILED":
        return f"grant the URL's user WRITE on topic {topic!r}"
    if name in ("MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        return "raise the topic's max.message.bytes or make the input smaller"
    if name in ("TOPIC_EXCEPTION", "INVALID_TOPIC_EXCEPTION", "_INVALID_ARG"):
        return (
            f"topic {topic!r} is not a valid Kafka topic name: 1 to 249 characters, each an "
            "ASCII letter, digit, '.', '_' or '-', and not '.' or '..'; route the message's "
            "queue to a valid topic (the URL's topic option or the queue name) and retry it"
        )
    return "make the record acceptable to the topic (its schema or policy) or discard it"
