"""One rank of a store scenario, run as its own process by tests/distributed/test_store.py:
``python store_worker.py SCENARIO``, with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
DNNKIT_TEST_TIMEOUT in the environment. Prints one JSON line: {"ok": ...} with what the
scenario saw, or {"error": message, "type": class name, "ranks": [...], "elapsed": s}.
No GPU and no numba: the store is plain TCP."""

import json
import os
import sys
import time

from dnnkit.distributed import env, group, store as store_mod, watchdog
from dnnkit.distributed.data_parallel import check_same_model
from dnnkit.distributed.nccl import LocalComm

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
ADDR, PORT = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
T = float(os.environ.get("DNNKIT_TEST_TIMEOUT", "20"))


def connect(role="main"):
    return store_mod.Store(ADDR, PORT, RANK, WORLD, timeout=T, role=role)


SERVERS = []


def serve():
    """Rank 0's server. Rank 0 keeps it up until the others have gone, whatever its own
    scenario raised (as group.destroy() does), so that they hear the server's verdict."""
    if RANK != 0:
        return None
    SERVERS.append(store_mod.StoreServer(PORT, WORLD))
    return SERVERS[-1]


def finish(server, client, result):
    client.close()
    if server is not None:
        server.wait_for_clients(T)
        server.close()
    return result


def basic():
    server, c = serve(), connect()
    c.barrier("start")
    c.set(f"k{RANK}", f"value of {RANK}".encode())
    got = [c.get(f"k{r}", from_rank=r).decode() for r in range(WORLD)]
    total = c.add("counter", RANK + 1)
    c.wait([f"k{r}" for r in range(WORLD)])
    c.barrier("start")                # a second barrier of the same name is a new one
    final = c.add("counter", 0)
    c.barrier("end")
    return finish(server, c, {"got": got, "added": total, "final": final})


def die_before_barrier():
    serve()
    c = connect()
    if RANK == 1:
        time.sleep(0.5)
        os._exit(3)                   # no bye: the store sees the connection close
    time.sleep(1.0)
    c.barrier("b")                    # fails at once, naming rank 1


def late():
    """Every rank connects; the last one never reaches the barrier."""
    serve()
    c = connect()
    if RANK == WORLD - 1:
        time.sleep(T + 5)
        return {}
    c.barrier("b", timeout=2.0)


def absent():
    """Run with fewer processes than WORLD_SIZE: the missing ranks never connect."""
    serve()
    c = connect()
    c.barrier("b", timeout=2.0)


def get_from_dead():
    serve()
    c = connect()
    if RANK == 1:
        time.sleep(0.5)
        os._exit(4)
    c.get("never", from_rank=1)


def get_timeout():
    """Rank 1 waits for a key rank 0 (alive, connected) never sets."""
    server, c = serve(), connect()
    if RANK == 0:
        time.sleep(3.0)
        return finish(server, c, {})
    c.get("never", timeout=1.0, from_rank=0)


def no_server():
    connect()                          # no rank 0 anywhere: names rank 0


def server_dies():
    serve()
    c = connect()
    if RANK == 0:
        time.sleep(1.0)
        os._exit(5)
    c.barrier("b")                     # rank 0 gone: "lost the rendezvous store"


def duplicate():
    """Two processes both say RANK=1 (the test starts them so)."""
    server = store_mod.StoreServer(PORT, WORLD) if os.environ.get("SERVE") else None
    c = connect()
    c.set("joined", b"1")
    time.sleep(3.0)
    return finish(server, c, {})


def culprits():
    """Rank 1 exits, rank 2 beats once then stays silent; rank 0 names both from status."""
    server, c = serve(), connect()
    if RANK == 1:
        c.barrier("up")
        os._exit(6)
    if RANK == 2:
        w = connect("watch")
        w.beat({"issued": 1, "done": 1})
        c.barrier("up")
        time.sleep(T)
        return {}
    c.barrier("up")
    time.sleep(3.5)                     # rank 2's heartbeat ages past the limit of 3 s
    text, ranks = watchdog.name_culprits(c.status(), 0, WORLD, 2, limit=3.0)
    server.close()
    return {"text": text, "ranks": list(ranks)}


def model_check():
    """check_same_model through the store; rank 1's first layer has another shape."""
    server, c = serve(), connect()
    penv = env.ProcessEnv(RANK, WORLD, RANK, ADDR, PORT, "env")
    g = group.ProcessGroup(penv, T, None, LocalComm(), c, server)
    entries = [["parameter", "fc1.weight", [4, 3], "float32", True],
               ["parameter", "fc1.bias", [4], "float32", True],
               ["buffer", "bn.running_mean", [4], "float32", False]]
    if RANK == 1:
        entries[0][2] = [4, 5]
    try:
        check_same_model(g, entries)
    finally:
        finish(server, c, None)


SCENARIOS = {f.__name__: f for f in (basic, die_before_barrier, late, absent, get_from_dead,
                                      get_timeout, no_server, server_dies, duplicate, culprits,
                                      model_check)}

if __name__ == "__main__":
    t0 = time.monotonic()
    try:
        out = {"ok": SCENARIOS[sys.argv[1]]()}
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = {"error": str(e), "type": type(e).__name__,
               "ranks": list(getattr(e, "ranks", ()))}
    out["elapsed"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    for server in SERVERS:
        server.wait_for_clients(10)
    os._exit(0)
