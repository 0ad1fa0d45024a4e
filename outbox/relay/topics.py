"""What an events topic's settings risk once the relay has published to it.

The relay records a batch as published when Kafka commits it; a topic that
drops committed records afterwards loses them with nothing left to publish
them again. Said, never refused: the topic is the user's.
"""

from __future__ import annotations

from collections.abc import Mapping


def risks(topic: str, config: Mapping[str, str | None]) -> list[str]:
    """What in an events topic's `config` (its describe_configs values) can lose what was published
    to it, as lines an operator can act on."""
    found = []
    if config.get("unclean.leader.election.enable") == "true":
        found.append(
            f"events topic {topic!r} allows an unclean leader election: a replica out of sync made"
            " leader drops the latest committed records, which the relay has recorded as published and"
            " will not publish again. Set unclean.leader.election.enable=false (kafka-configs --alter)"
        )
    return found
