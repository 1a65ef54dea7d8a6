"""How a launch names its hosts, and when a worker that stopped answering is a lost host."""
import functools

import pytest

from distgrad.launch import placement
from distgrad.launch.placement import Placement

pytestmark = pytest.mark.timeout(30)


def _world(hostnames):
    """Ranks 0-3: 0 and 1 at 10.0.0.1, 2 and 3 at 10.0.0.2."""
    return Placement({r: {"name": "coordinator" if r == 0 else f"worker{r}",
                          "hostname": hostnames[r // 2], "address": f"10.0.0.{1 + r // 2}"}
                      for r in range(4)})


def test_a_host_is_named_by_its_host_name_unless_hosts_share_one(tmp_path, monkeypatch):
    assert _world(["a", "b"]).label("10.0.0.2") == "b (10.0.0.2)"
    # containers (and simulated hosts) often share a name: /etc/hosts's, else the address
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.2 node2 node2.lan  # the second\n")
    monkeypatch.setattr(placement, "_hosts_file_name",
                        functools.partial(placement._hosts_file_name, path=str(hosts)))
    shared = _world(["box", "box"])
    assert (shared.label("10.0.0.1"), shared.label("10.0.0.2")) == ("10.0.0.1",
                                                                     "node2 (10.0.0.2)")


def test_a_host_is_lost_when_none_of_its_ranks_answers(monkeypatch):
    world = _world(["a", "b"])
    answers = {}
    monkeypatch.setattr(Placement, "answering",
                        lambda self, ranks, timeout: {r: answers.get(r, False) for r in ranks})
    lost = world.lost_host(2, timeout=1.0)
    assert lost["ranks"] == [2, 3] and lost["workers"] == ["worker2", "worker3"]
    assert lost["label"] == "b (10.0.0.2)"
    answers[3] = True  # its neighbour answers: one process failed, not the host
    assert world.lost_host(2, timeout=1.0) is None
    # the coordinator's own host is never lost from where the coordinator stands
    assert world.lost_host(1, timeout=1.0) is None
