"""Routed URLs for the HTTP publisher: `--http-url https://api.example/hooks/{event_type}`.

Placeholders are those of every template (template.py): `{event_type}`, `{aggregate_type}`
and `{aggregate_id}`. They may stand in the path and the query only: a
template with one in the scheme, the user-info, the host or the port (which could send a
message to another server), in the fragment (never sent), or with an unknown name, is refused
at start. Each value is percent-encoded whole (RFC 3986's unreserved characters only stay),
so that it cannot add a path segment, a query, a fragment or user-info: `/`, `?`, `#`, `@`,
`&`, `=`, `%` and anything outside ASCII are encoded. A value that would make a whole path
segment empty, `.` or `..` (a dot-segment, which clients and proxies resolve, percent-encoded
or not) makes the message permanent instead, as does a URL longer than MAX_URL_LENGTH.

The host cannot vary, so every URL a template renders has the template's origin: one
destination with one breaker, as with a NATS subject template.
"""

from __future__ import annotations

import urllib.parse

from outbox.models import Message
from outbox.plumbing.redact import redact_url
from outbox.worker.publishers.base import PermanentError
from outbox.worker.publishers.template import PLACEHOLDERS, Renderings, Template

__all__ = ["PLACEHOLDERS", "Router", "check_template", "placeholders", "sample", "segment"]
# Longer URLs are refused by many servers and proxies (414); the message is dead instead.
MAX_URL_LENGTH = 8192
ROUTE_CACHE_SIZE = 4096  # rendered URLs kept; emptied when full


def url_template(template: str) -> Template:
    """A URL template checked as a template: ValueError for an unknown placeholder. Its
    values are percent-encoded whole (`segment`)."""
    return Template(template, segment, shown=repr(redact_url(template)))


def placeholders(template: str) -> list[str]:
    """The placeholders of a URL template, checked: ValueError for an unknown one."""
    return url_template(template).names


def sample(template: str) -> str:
    """The template rendered with a plain value for each placeholder: a URL of its shape
    (its origin is every rendering's)."""
    return url_template(template).sample()


def check_template(template: str) -> None:
    """ValueError unless every placeholder stands in the path or the query."""
    # Where the authority ends: the first `/`, `?` or `#` after `scheme://`.
    scheme_end = template.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else 0
    ends = [i for i in (template.find(c, start) for c in "/?#") if i >= 0]
    authority_end = min(ends) if ends else len(template)
    fragment = template.find("#")
    first = template.find("{")
    if 0 <= first < authority_end:
        raise ValueError(
            f"{redact_url(template)!r}: a placeholder in the scheme, user-info, host or port "
            "could send messages to another server; placeholders go in the path or the query"
        )
    if fragment >= 0 and template.find("{", fragment) >= 0:
        raise ValueError(
            f"{redact_url(template)!r}: a placeholder in the fragment (never sent); "
            "placeholders go in the path or the query"
        )


def segment(value: str) -> str:
    """A value percent-encoded whole: it stays inside one path segment or query value."""
    return urllib.parse.quote(value, safe="")


class Router:
    """Renders a URL template per message (cached per event type, aggregate type and, when
    the template uses it, aggregate id)."""

    def __init__(self, template: str) -> None:
        self.template = template
        self._template = url_template(template)
        self._sample_segments = urllib.parse.urlsplit(self._template.sample()).path.split("/")
        self._urls = Renderings(self._template, self._render, ROUTE_CACHE_SIZE)

    def url(self, message: Message) -> str:
        return self._urls.of(message)

    def _render(self, message: Message) -> str:
        url = self._template.render(message)
        if len(url) > MAX_URL_LENGTH:
            raise PermanentError(
                f"the routed URL is {len(url)} characters, more than {MAX_URL_LENGTH}: not sent"
            )
        # Encoded values hold no `/`: the path has the template's segments, each either as
        # written or holding a placeholder's value.
        segments = urllib.parse.urlsplit(url).path.split("/")
        for rendered, sample in zip(segments, self._sample_segments, strict=True):
            if rendered != sample and rendered in ("", ".", ".."):
                raise PermanentError(
                    f"the routed URL's path segment would be {rendered!r} "
                    f"(event_type {message.event_type[:64]!r}, aggregate_type "
                    f"{message.aggregate_type[:64]!r}, aggregate_id "
                    f"{message.aggregate_id[:64]!r}): not sent"
                )
        return url
