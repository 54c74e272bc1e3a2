"""The rendezvous store across real processes on localhost (tests/distributed/store_worker.py):
set/get/add/wait/barrier, a rank that dies (named at once), a rank that never connects or
never arrives (named after the timeout), a lost store (rank 0 named), a duplicate rank, the
culprits named from the store's status, and the model comparison of DataParallel through the
store. No GPU: plain TCP and processes."""

import pytest

from dnnkit.distributed import watchdog

from .procs import HERE, Ranks, free_port, last_json, python, rank_env

WORKER = HERE / "store_worker.py"
T = 20           # the scenarios' store timeout (seconds): far above what the passing ones take


def run(scenario, world, *, ranks=None, timeout=90, **extra):
    port = free_port()
    ranks = range(world) if ranks is None else ranks
    envs = [rank_env(r, world, port, DNNKIT_TEST_TIMEOUT=T, **extra) for r in ranks]
    with Ranks(python(WORKER, scenario), envs) as procs:
        results = procs.wait(timeout)
    for code, out, err in results:
        assert code is not None, f"a rank of {scenario} did not finish:\n{out}\n{err}"
    return [last_json(out) if out.strip() else {"exit": code, "stderr": err}
            for code, out, err in results]


def test_set_get_add_wait_barrier_across_three_processes():
    res = run("basic", 3)
    for r in res:
        assert "ok" in r, r
        assert r["ok"]["got"] == [f"value of {k}" for k in range(3)]
        assert r["ok"]["final"] == 1 + 2 + 3
    assert sorted(r["ok"]["added"] for r in res)[-1] == 6


def test_a_rank_that_dies_is_named_at_once():
    res = run("die_before_barrier", 3)
    assert res[1] == {"exit": 3, "stderr": ""}
    for r in (res[0], res[2]):
        assert r["type"] == "DistributedError" and r["ranks"] == [1], r
        assert "rank 1 exited" in r["error"] and "barrier 'b#1'" in r["error"]
        assert r["elapsed"] < T / 2             # not the timeout: the closed connection


def test_a_rank_that_never_connects_is_named_after_the_timeout():
    res = run("absent", 3, ranks=[0, 1])        # rank 2 is never started
    for r in res:
        assert r["type"] == "DistributedError" and r["ranks"] == [2], r
        assert "rank 2 never connected to the store within 2 s" in r["error"]
        assert "ranks 0, 1 arrived" in r["error"]
        assert 2.0 <= r["elapsed"] < T


def test_a_rank_that_never_arrives_is_named_after_the_timeout():
    port = free_port()
    envs = [rank_env(r, 3, port, DNNKIT_TEST_TIMEOUT=T) for r in range(3)]
    with Ranks(python(WORKER, "late"), envs) as procs:
        results = procs.wait(15)                # rank 2 sleeps on: killed here
    for code, out, _ in results[:2]:
        r = last_json(out)
        assert r["ranks"] == [2] and "rank 2 connected but did not arrive within 2 s" in \
            r["error"], r


def test_get_from_a_rank_that_dies_and_get_timeout():
    res = run("get_from_dead", 2)
    assert res[0]["ranks"] == [1]
    assert "rank 1 exited" in res[0]["error"] and "before setting it" in res[0]["error"]
    assert res[0]["elapsed"] < T / 2
    res = run("get_timeout", 2)
    assert res[0]["ok"] == {}
    assert res[1]["error"] == "get: key 'never' was not set within 1 s (rank 0 should set it)"
    assert res[1]["ranks"] == [0]


def test_no_store_names_rank_0():
    port = free_port()
    with Ranks(python(WORKER, "no_server"), [rank_env(1, 2, port, DNNKIT_TEST_TIMEOUT=2)]) \
            as procs:
        (code, out, _), = procs.wait(60)
    r = last_json(out)
    assert r["ranks"] == [0]
    assert f"rank 1 could not reach the rendezvous store of rank 0 at 127.0.0.1:{port} " \
           f"within 2 s" in r["error"]


def test_losing_the_store_names_rank_0():
    res = run("server_dies", 2)
    assert res[0] == {"exit": 5, "stderr": ""}
    assert res[1]["ranks"] == [0]
    assert "rank 1 lost the rendezvous store on rank 0" in res[1]["error"]


def test_two_processes_with_one_rank():
    # three interpreters start at once here: on a loaded two-core machine rank 0's store took
    # more than T = 20 s to listen once (the ranks 1 timed out, "connection refused"), so
    # this scenario, which ends as soon as the store is up, waits longer
    port = free_port()
    envs = [rank_env(0, 2, port, DNNKIT_TEST_TIMEOUT=3 * T, SERVE=1),
            rank_env(1, 2, port, DNNKIT_TEST_TIMEOUT=3 * T),
            rank_env(1, 2, port, DNNKIT_TEST_TIMEOUT=3 * T)]
    with Ranks(python(WORKER, "duplicate"), envs) as procs:
        results = procs.wait(6 * T)
    errors = [last_json(out) for _, out, _ in results[1:]]
    bad = [e for e in errors if "error" in e]
    assert len(bad) == 1, errors
    assert "two processes say they are rank 1" in bad[0]["error"]


def test_status_names_a_dead_rank_and_a_silent_one():
    res = run("culprits", 3, timeout=60)
    text, ranks = res[0]["ok"]["text"], res[0]["ok"]["ranks"]
    assert ranks == [1, 2]
    assert "rank 1 exited" in text
    assert "rank 2 stopped responding (no heartbeat for" in text


def test_model_mismatch_is_named_on_every_rank_through_the_store():
    res = run("model_check", 3)
    for r in res:
        assert r["type"] == "ValueError", r
        assert r["error"] == ("DataParallel: the model differs across ranks: parameter "
                              "'fc1.weight' has shape (4, 5) on rank 1 but (4, 3) on rank 0")


# ---------------------------------------------------------------- naming, without processes

STATUS = {"world_size": 4, "joined": [0, 1, 2], "left": [], "dead": {"1": 2.5},
          "beats": {"0": [0.2, {"issued": 7}], "2": [0.3, {"issued": 6}]}}


@pytest.mark.parametrize("status,waiting,want,ranks", [
    (None, 3, "the rendezvous store on rank 0 cannot be reached", (0,)),
    (STATUS, 7, "rank 1 exited (its connection to the store closed 2.5 s ago); rank 2 has "
                "queued 6 collectives and not yet this rank's collective #7", (1, 2, 3)),
    (dict(STATUS, dead={}, joined=[0, 1, 2, 3], beats={"1": [0.1, {"issued": 9}],
                                                         "2": [0.1, {"issued": 9}],
                                                         "3": [0.1, {"issued": 9}]}),
     7, "no other rank is known to have failed", ()),
    (dict(STATUS, dead={}, left=[3], joined=[0, 1, 2, 3],
          beats={"1": [40.0, {"issued": 9}], "2": [0.1, {"issued": 9}]}),
     7, "rank 1 stopped responding (no heartbeat for 40.0 s", (1, 3)),
])
def test_name_culprits(status, waiting, want, ranks):
    text, got = watchdog.name_culprits(status, 0, 4, waiting, limit=30.0)
    assert want in text
    assert got == ranks
    if 3 in ranks and status is not None and 3 not in status["joined"]:
        assert "rank 3 never connected to the store" in text


def test_a_port_in_use_is_refused_with_its_number():
    from dnnkit.distributed import DistributedError
    from dnnkit.distributed.store import StoreServer
    first = StoreServer(0, 2)
    try:
        with pytest.raises(DistributedError, match=f"rank 0 cannot listen on port {first.port} "
                                                   f"for the rendezvous store: .*MASTER_PORT"):
            StoreServer(first.port, 2)
    finally:
        first.close()
