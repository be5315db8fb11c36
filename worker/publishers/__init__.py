"""Publishers and the failure classes they raise."""

from outbox.worker.publishers.base import Defer, PermanentError, Publisher, RetryableError

__all__ = ["Defer", "PermanentError", "Publisher", "RetryableError"]
