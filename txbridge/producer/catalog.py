"""The partition counts of the cluster's topics, as a producer last listed them.

The producer refuses a message whose topic or partition is not in the listing
before its half record is written (committed, it would only be quarantined).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from txbridge.transaction import Message

#: How long a listing that showed a topic is trusted (a missing topic is asked again at every send).
TOPIC_CACHE_S = 10.0


class TopicCatalog:
    """Partition counts of the cluster's topics, from the last full metadata listing.

    A topic in the listing stays known for ``ttl_s``; a topic missing from it is
    never trusted as missing for a later send: that send lists again, so creating
    the topic fixes things without restarting the producer.

    Args:
        ttl_s: how long a listing is trusted for the topics it showed.
    """

    def __init__(self, ttl_s: float = TOPIC_CACHE_S) -> None:
        self.ttl_s = ttl_s
        self._counts: Mapping[str, int] = {}
        self._listed_at = float("-inf")  # when the last listing was requested
        self._trusted_until = float("-inf")  # until when the topics it showed are trusted

    def stale(self, messages: Iterable[Message], asked_at: float) -> bool:
        """True when the topics of ``messages`` must be listed again for a send begun at ``asked_at``.

        A listing requested at or after ``asked_at`` answers for every topic (another thread's
        listing too); an older one only for the topics it showed, while it is trusted.
        """
        if self._listed_at >= asked_at:
            return False
        if asked_at > self._trusted_until:
            return True
        counts = self._counts
        return any(msg.topic not in counts for msg in messages)

    def known(self, messages: Iterable[Message]) -> bool:
        """True when every topic of ``messages`` was in the last listing, however old."""
        counts = self._counts
        return all(msg.topic in counts for msg in messages)

    def update(self, counts: Mapping[str, int | None], listed_at: float) -> None:
        """Replace the counts with a listing requested at ``listed_at`` (``None``: an unusable topic)."""
        self._counts = {name: count for name, count in counts.items() if count is not None}
        self._listed_at = listed_at
        self._trusted_until = listed_at + self.ttl_s

    def keep(self, now: float) -> None:
        """A listing failed: trust the last one's topics for another ``ttl_s`` instead of asking
        again at every send (each would wait out the metadata timeout)."""
        self._trusted_until = now + self.ttl_s

    def partitions(self, topic: str) -> int | None:
        """``topic``'s partition count in the last listing, None when it was not there."""
        return self._counts.get(topic)
