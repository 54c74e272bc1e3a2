"""One rank of the MPI scenario of tests/distributed/test_mpi.py, started by ``mpiexec -n 2``
(MPICH's or Open MPI's variables, no RANK/WORLD_SIZE/MASTER_*): the environment read as
dnnkit.distributed.init() reads it, rank 0's store address broadcast over MPI
(env.mpi_master), then the rendezvous store at that address: a barrier and an exchange.
Prints one JSON line {"rank": r, ...}. No GPU and no numba: the store is plain TCP."""

import json
import sys

from dnnkit.distributed import env, store as store_mod

T = 60.0


def main():
    penv = env.from_environ()
    full = env.mpi_master(penv)
    server = store_mod.StoreServer(full.master_port, full.world_size) if full.rank == 0 \
        else None
    client = store_mod.Store(full.master_addr, full.master_port, full.rank, full.world_size,
                             timeout=T)
    client.barrier("mpi/start")
    client.set(f"hello/{full.rank}", f"rank {full.rank}".encode())
    got = [client.get(f"hello/{r}", timeout=T, from_rank=r).decode()
           for r in range(full.world_size)]
    client.barrier("mpi/end")
    client.close()
    if server is not None:
        server.wait_for_clients(T)
        server.close()
    print(json.dumps({"rank": full.rank, "source": penv.source, "before": penv.master_addr,
                      "world": full.world_size, "local": full.local_rank,
                      "addr": full.master_addr, "port": full.master_port, "got": got}),
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
