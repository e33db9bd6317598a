"""The launches of parallel pytest workers never listen on one port
(helpers_launch.free_port): each worker takes its ring's ports from a block of
its own. Tried: the ports the OS hands out (a bind to port 0, released), as
before; 200 launches' ports per worker then overlap and this fails."""

from suites.distributed.helpers_launch import PORT_BLOCK, RANKS, free_port


def _ports(monkeypatch, worker: str, launches: int) -> set:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    return {base + r for base in (free_port() for _ in range(launches)) for r in range(RANKS)}


def test_two_workers_never_take_the_same_port(monkeypatch):
    first, second = (_ports(monkeypatch, w, 200) for w in ("gw0", "gw1"))
    assert first and second and not first & second, sorted(first & second)[:10]


def test_a_worker_takes_each_of_its_ports_in_turn_before_any_again(monkeypatch):
    # a launch's ports are released when it ends; turning through the block
    # keeps a just-ended launch's ports (in TIME_WAIT, say) out of the next one
    taken = _ports(monkeypatch, "gw3", PORT_BLOCK // RANKS)
    assert len(taken) == PORT_BLOCK // RANKS * RANKS
