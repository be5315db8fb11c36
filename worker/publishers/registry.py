"""Finding publishers by name: built-ins and third-party plugins alike.

A publisher is found by its name in the `outbox.publishers` entry-point group (the built-ins
register there too, see pyproject.toml), or by a dotted path `package.module:Class`. Each
publisher class declares its own options; they become `--flags` backed by `OUTBOX_*`
variables, and `outbox-worker --publisher NAME --help` lists them.

A third-party publisher is a class like this one, registered in its own package with
`[project.entry-points."outbox.publishers"] sqs = "outbox_sqs:SqsPublisher"`::

    class SqsPublisher:
        name = "sqs"
        options = (Option("--sqs-queue-url", "queue to send to", required=True),)

        @classmethod
        def create(cls, values: dict[str, Any], context: PublisherContext) -> "SqsPublisher":
            return cls(values["sqs_queue_url"])

        async def start(self) -> None: ...
        async def publish(self, message: Message) -> None: ...  # raise RetryableError, ...
        async def close(self) -> None: ...
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol

from outbox.extras import MissingExtra, missing_requirement, require
from outbox.plumbing.errors import SettingError
from outbox.publisher_options import ENTRY_POINT_GROUP, Option
from outbox.worker.publishers.base import BatchPublisher, Publisher

# `package.module:Class` (or `:Outer.Inner`), absolute: a relative or empty module is refused.
_PLUGIN_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def shown_values(options: tuple[Option, ...], values: Mapping[str, Any]) -> str:
    """`name=value` for each option given, secrets masked: for the start-up line."""
    return " ".join(
        f"{option.flag.lstrip('-')}={option.shown(values[option.dest])}"
        for option in options
        if values.get(option.dest) not in (None, (), [])
    )


@dataclass(frozen=True)
class PublisherContext:
    """What every publisher may need from the worker's own settings."""

    owner: str
    concurrency: int
    publish_timeout: float  # seconds
    # A broker told us it dropped a message as a duplicate (e.g. a JetStream PubAck with
    # duplicate=true): counted in outbox_broker_duplicates_total.
    count_broker_duplicate: Callable[[], None] = lambda: None
    # What goes on the wire (`--format`, see formats.py), and a CloudEvent's `source`.
    format: str = "envelope"
    cloudevents_source: str = "/outbox/outbox"


class PublisherFactory(Protocol):
    name: ClassVar[str]
    options: ClassVar[tuple[Option, ...]]

    @classmethod
    def create(
        cls, values: dict[str, Any], context: PublisherContext
    ) -> Publisher | BatchPublisher: ...


# Built-in publishers whose client library comes with an extra of its own.
_EXTRA_OF = {"nats": "nats", "kafka": "kafka"}


def registered_names() -> list[str]:
    """Every publisher registered by name: the built-in ones and installed plugins'."""
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def builtin_names() -> list[str]:
    """The publishers this package registers itself (pyproject's entry points: one source)."""
    own = __name__.rpartition(".")[0] + "."
    return sorted(
        ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value.startswith(own)
    )


def builtin_installed(name: str) -> bool:
    """Whether a built-in publisher's client library is installed: the `worker` extra alone
    brings http, log and null, not the brokers' clients."""
    extra = _EXTRA_OF.get(name)
    return extra is None or missing_requirement(extra) is None


def load_publisher(name: str) -> type[PublisherFactory]:
    """The publisher class for a registered name or a `package.module:Class` path."""
    if ":" in name:
        if not _PLUGIN_PATH.match(name):
            raise SettingError(
                f"--publisher: {name!r} is not a plugin path (expected package.module:Class)"
            )
        module_name, _, attribute = name.partition(":")
        try:
            found_object: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                found_object = getattr(found_object, part)
            factory = found_object
        except Exception as exc:  # whatever a plugin's import raises, it is one line
            raise SettingError(
                f"--publisher: cannot load {name!r}: {type(exc).__name__}: {exc}"
            ) from None
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = ", ".join(registered_names())
            raise SettingError(
                f"--publisher: unknown publisher {name!r} (known: {known}; or package.module:Class)"
            )
        if name in _EXTRA_OF:
            try:
                require(_EXTRA_OF[name])
            except MissingExtra as exc:
                raise SettingError(f"--publisher {name}: {exc}") from None
        try:
            factory = found[0].load()
        except Exception as exc:  # whatever a plugin's import raises, it is one line
            raise SettingError(f"--publisher: {name!r} cannot be loaded: {exc}") from None
    for attribute in ("name", "options", "create"):
        if not hasattr(factory, attribute):
            raise SettingError(f"--publisher: {name!r} is not a publisher (no {attribute!r})")
    return factory  # type: ignore[no-any-return]
