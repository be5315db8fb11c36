"""A publisher plugin as a third party writes one, against the plugin API alone: it carries
each message's id to a roost (a file), under a seal (a token, its secret option) and with
the tags given. Nothing of the project names it: the worker finds it by its entry point, and
the operator renders, checks and documents it from its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outbox.worker.plugin import Message, Option, PublisherContext


class OwlPostPublisher:
    name = "owlpost"
    options = (
        Option("--owlpost-roost", "file each message's id is appended to", required=True),
        Option("--owlpost-seal", "token written beside each id", required=True, secret=True),
        Option("--owlpost-tag", "tag written after each id", repeatable=True),
    )

    def __init__(self, roost: str, seal: str, tags: tuple[str, ...]) -> None:
        self.roost = Path(roost)
        self.seal = seal
        self.tags = tags

    @classmethod
    def create(cls, values: dict[str, Any], context: PublisherContext) -> OwlPostPublisher:
        return cls(values["owlpost_roost"], values["owlpost_seal"], tuple(values["owlpost_tag"]))

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, message: Message) -> None:
        with self.roost.open("a") as out:
            out.write(" ".join((str(message.id), self.seal, *self.tags)) + "\n")
