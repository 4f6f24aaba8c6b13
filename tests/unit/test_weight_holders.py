"""The holder registry of engine servers (docs/scaling.md, "A restarted server's weights from a holder"):
which server holds which version whole, the choice of the holder that serves a reader (TensorHub's case:
holders of v7 on nodeA and nodeB, a reader on nodeB served by nodeB), the next holder after a failure,
none left (the learner sends), and the node a server reports."""
from __future__ import annotations

import socket
import sys

from lmrl.engines.holders import Holder, Holders, choose_holder
from lmrl.engines.server import node_name


def test_a_reader_is_served_by_the_holder_on_its_own_node():
    holders = [Holder(0, "nodeA"), Holder(1, "nodeB")]
    assert choose_holder(holders, "nodeB") == 1  # the same node first, though server 0 has the lower index
    assert choose_holder(holders, "nodeA") == 0
    assert choose_holder(holders, "nodeC") == 0  # no holder on its node: any, ties by the lowest index


def test_a_failed_holder_is_left_out_and_the_next_one_serves():
    holders = [Holder(0, "nodeA"), Holder(1, "nodeB"), Holder(2, "nodeB")]
    assert choose_holder(holders, "nodeB") == 1
    assert choose_holder(holders, "nodeB", failed={1}) == 2  # the other one on nodeB
    assert choose_holder(holders, "nodeB", failed={1, 2}) == 0  # then another node
    assert choose_holder(holders, "nodeB", failed={0, 1, 2}) is None  # none left: the learner sends
    assert choose_holder([], "nodeA") is None


def test_the_registry_tracks_whole_versions_per_server():
    registry = Holders()
    registry.place(0, "nodeA")
    registry.place(1, "nodeB")
    registry.place(2, "nodeB")
    assert registry.lacking(7) == [0, 1, 2] and registry.of(7) == []  # started: nothing held
    registry.publish(0, 7)
    registry.publish(1, 7)
    registry.publish(2, 6)
    assert registry.of(7) == [Holder(0, "nodeA"), Holder(1, "nodeB")]
    assert registry.lacking(7) == [2]
    assert choose_holder(registry.of(7), registry.node_of(2)) == 1
    registry.drop(1)  # it died: server 2's reader goes to nodeA
    assert registry.version_of(1) is None and registry.lacking(7) == [1, 2]
    assert choose_holder(registry.of(7), registry.node_of(2)) == 0
    registry.place(1, "nodeC")  # started again elsewhere
    assert registry.node_of(1) == "nodeC" and registry.version_of(1) is None


def test_a_server_outside_ray_reports_its_host_name(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert node_name() == socket.gethostname()
