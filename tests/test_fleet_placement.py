"""Where `tandem fleet analyze` runs each session, and what it takes for a session (no Ray needed)."""
from __future__ import annotations

import json

import pytest

from engine.errors import TandemError
from engine.fleet.run import find_sessions, place

NODES = [
    {"NodeID": "node-a", "NodeManagerAddress": "10.1.0.1", "NodeManagerHostname": "web-1", "Alive": True},
    {"NodeID": "node-b", "NodeManagerAddress": "10.1.0.2", "NodeManagerHostname": "web-2", "Alive": True},
    {"NodeID": "node-c", "NodeManagerAddress": "10.1.0.3", "NodeManagerHostname": "web-3", "Alive": False},
]


def test_node_path_runs_on_that_node_by_name_or_address():
    placed = place(["web-2:/var/lib/tandem/s1", "10.1.0.1:/data/s2"], NODES, "driver-node")
    assert [(p.path, p.node_id) for p in placed] == [("/var/lib/tandem/s1", "node-b"), ("/data/s2", "node-a")]


def test_a_dead_or_unknown_node_is_refused_with_the_known_ones():
    with pytest.raises(TandemError, match="no live Ray node named web-3.*web-1"):
        place(["web-3:/s"], NODES, "driver-node")


def test_a_local_path_runs_on_the_driver_node(tmp_path):
    (placed,) = place([str(tmp_path)], NODES, "driver-node")
    assert placed.node_id == "driver-node" and placed.path == str(tmp_path)


def test_sources_expand_to_sessions(tmp_path):
    for name in ("s1", "s2"):
        (tmp_path / "day" / name).mkdir(parents=True)
        (tmp_path / "day" / name / "session.json").write_text(json.dumps({"hostname": "h"}))
    (tmp_path / "day" / "notes").mkdir()
    found = find_sessions([str(tmp_path / "day"), str(tmp_path / "day" / "s1"), "web-1:/remote/s9"])
    assert found == [str(tmp_path / "day" / "s1"), str(tmp_path / "day" / "s2"), "web-1:/remote/s9"]  # s1 once
    with pytest.raises(TandemError, match="neither a session"):
        find_sessions([str(tmp_path / "day" / "notes")])
    with pytest.raises(TandemError, match="no such directory"):
        find_sessions([str(tmp_path / "missing")])
