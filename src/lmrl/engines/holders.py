"""Which engine server holds which complete version, on which node, and which holder serves a reader.

TensorHub's reference-oriented storage (docs/scaling.md, "A restarted server's weights from a
holder"): a version stays readable while at least one holder has it, and a reader that needs it
reads it from a holder chosen by topology, retrying another holder when that one fails. Here the
holders are the engine servers of one pool and the readers are servers started again after a death:
`Holders` records what each server holds (only whole versions: a server that received a partial
broadcast on top of a whole one holds the new one whole), `choose_holder` picks the holder for a
reader (the same node first, then any; ties by the lowest server index), and `Recovery` says how a
recovery was served. The pool (`engines.server_pool`) does the transfers.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Holder:
    """A server that holds a version whole, and the node it runs on."""

    server: int
    node: str


class Holders:
    """What each server of a pool holds: its node, and the version it holds whole (None: none yet)."""

    def __init__(self):
        self.nodes: dict[int, str] = {}
        self.versions: dict[int, int | None] = {}

    def place(self, server: int, node: str) -> None:
        """A server (re)started on `node`: it holds nothing yet."""
        self.nodes[server], self.versions[server] = node, None

    def publish(self, server: int, version: int) -> None:
        self.versions[server] = version

    def drop(self, server: int) -> None:
        """A server that died: it holds nothing."""
        self.versions[server] = None

    def version_of(self, server: int) -> int | None:
        return self.versions.get(server)

    def node_of(self, server: int) -> str:
        return self.nodes[server]

    def of(self, version: int) -> list[Holder]:
        """The holders of `version`, by server index."""
        return [Holder(s, self.nodes[s]) for s, v in sorted(self.versions.items()) if v == version]

    def lacking(self, version: int) -> list[int]:
        """The servers that do not hold `version` whole."""
        return [s for s, v in sorted(self.versions.items()) if v != version]


def choose_holder(holders: list[Holder], reader_node: str, failed: set[int] = frozenset()) -> int | None:
    """The server that serves a reader on `reader_node`: a holder on the same node first, then any; ties
    by the lowest index; holders in `failed` (they failed to serve in this recovery) left out. None: no
    holder is left, the learner sends the version."""
    live = [h for h in holders if h.server not in failed]
    if not live:
        return None
    return min(live, key=lambda h: (h.node != reader_node, h.server)).server


@dataclass
class Recovery:
    """How the servers that lacked the current version were given it."""

    version: int = 0
    served_by: dict[int, int | None] = field(default_factory=dict)  # server -> its holder (None: the learner)
    learner_bytes: int = 0  # what the learner broadcast for it
    peer_bytes: int = 0  # what holders sent, server to server
    transfer_s: float = 0.0  # the learner's time from the restarted servers' start-up until every server holds it
