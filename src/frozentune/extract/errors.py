"""The one error type of the backbone pass (device, precision, shards, resume)."""
from __future__ import annotations

from ..errors import FrozentuneError


class ExtractError(FrozentuneError, RuntimeError):
    """The backbone pass cannot run as asked (absent device, unsupported precision, a shard set
    that does not add up); the message says what to do."""
