"""Who this process is: its rank, the world size, its GPU on the host, and where the
rendezvous store listens; the ``dnn.distributed.timeout`` flag; the package's error class.

Sources, first match wins:

1. the launcher's variables (``python -m dnnkit.distributed.run``, torchrun and most
   schedulers' wrappers set them): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (default: RANK),
   ``MASTER_ADDR``, ``MASTER_PORT``;
2. an MPI launcher's own variables, when ``RANK`` and ``WORLD_SIZE`` are absent: Open MPI
   (``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``), MPICH and Intel MPI's Hydra
   (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``), Slurm's srun (``SLURM_PROCID``,
   ``SLURM_STEP_NUM_TASKS``, ``SLURM_LOCALID``). ``MASTER_ADDR``/``MASTER_PORT`` are still
   read; where they are absent and mpi4py is installed, rank 0 picks its host name and a free
   port and broadcasts them over MPI (:func:`mpi_master`);
3. none of these variables: a single process (rank 0 of 1), so that a training script runs
   unchanged without the launcher.

Every value is checked here, before any socket or GPU is touched: a ValueError names the
variable and the value.
"""

import math
import os
from typing import NamedTuple

from .. import config
from ..errors import DnnkitError


class DistributedError(DnnkitError):
    """A rank failed, hung or could not be reached, or NCCL reported an error. ``ranks``: the
    ranks the message names as the cause (empty when none is known)."""

    def __init__(self, message, *, ranks=()):
        super().__init__(message)
        self.ranks = tuple(ranks)


def _timeout(flag, value):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"flag {flag}: bad value {value!r}; a number of seconds > 0") from None
    if isinstance(value, bool) or not (0 < v < math.inf):
        raise ValueError(f"flag {flag}: bad value {value!r}; a finite number of seconds > 0 "
                         f"(a rank that hangs must become an error, never a silent wait)")
    return v


config.register_flag(
    "dnn.distributed.timeout", 300.0, _timeout,
    "seconds a rank waits for the others (rendezvous, barrier, NCCL set-up, a collective) "
    "before it fails with an error naming the rank that did not come")


def timeout():
    """The ``dnn.distributed.timeout`` flag, in seconds."""
    return config.get("dnn.distributed.timeout")


def check_timeout(where, value):
    """A ``timeout=`` argument of ``where``, checked as the flag is: seconds, finite, > 0."""
    try:
        return _timeout("timeout", value)
    except ValueError as e:
        raise ValueError(f"dnnkit.distributed.{where}: {str(e).replace('flag timeout: ', '')}"
                         ) from None


class ProcessEnv(NamedTuple):
    """This process's place in the job. ``master_addr``/``master_port``: the store's address
    (None for a single process, or under MPI until :func:`mpi_master` fills them);
    ``source``: "env", "openmpi", "mpich", "slurm" or "single"."""
    rank: int
    world_size: int
    local_rank: int
    master_addr: "str | None"
    master_port: "int | None"
    source: str


# (source, rank variable, size variable, local-rank variable)
LAUNCHERS = (
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    # srun sets SLURM_STEP_NUM_TASKS for the tasks of a step; a batch script itself (one
    # process, SLURM_NTASKS of the whole allocation) has SLURM_PROCID but not it
    ("slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"),
)


def _int(environ, name, low, default=None):
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ValueError(f"dnnkit.distributed: {name} is not set")
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ValueError(f"dnnkit.distributed: {name}={raw!r} is not an integer") from None
    if v < low:
        raise ValueError(f"dnnkit.distributed: {name}={v} must be >= {low}")
    return v


def from_environ(environ=None):
    """The :class:`ProcessEnv` of this process, read from ``environ`` (default os.environ);
    ValueError for a missing, malformed or inconsistent variable."""
    environ = os.environ if environ is None else environ
    if ("RANK" in environ) != ("WORLD_SIZE" in environ):
        given, missing = ("RANK", "WORLD_SIZE") if "RANK" in environ else ("WORLD_SIZE", "RANK")
        raise ValueError(f"dnnkit.distributed: {given} is set but {missing} is not; set both "
                         f"(the launcher python -m dnnkit.distributed.run does)")
    for source, rank_var, size_var, local_var in LAUNCHERS:
        if rank_var in environ and size_var in environ:
            break
    else:
        return ProcessEnv(0, 1, 0, None, None, "single")
    world = _int(environ, size_var, 1)
    rank = _int(environ, rank_var, 0)
    if rank >= world:
        raise ValueError(f"dnnkit.distributed: {rank_var}={rank} is not below "
                         f"{size_var}={world}")
    local = _int(environ, local_var, 0, default=rank)
    addr = environ.get("MASTER_ADDR", "").strip() or None
    port = None
    if "MASTER_PORT" in environ and environ["MASTER_PORT"].strip():
        port = _int(environ, "MASTER_PORT", 1)
        if port > 65535:
            raise ValueError(f"dnnkit.distributed: MASTER_PORT={port} is not a TCP port "
                             f"(1 to 65535)")
    if world > 1 and source == "env" and (addr is None or port is None):
        missing = " and ".join(n for n, v in (("MASTER_ADDR", addr), ("MASTER_PORT", port))
                               if v is None)
        raise ValueError(f"dnnkit.distributed: WORLD_SIZE={world} but {missing} is not set: "
                         f"rank 0's address and a free port for the rendezvous store")
    if (addr is None) != (port is None):
        given = "MASTER_ADDR" if addr is not None else "MASTER_PORT"
        other = "MASTER_PORT" if addr is not None else "MASTER_ADDR"
        raise ValueError(f"dnnkit.distributed: {given} is set but {other} is not")
    return ProcessEnv(rank, world, local, addr, port, source)


def mpi_master(penv):
    """``penv`` with the store's address filled in under MPI: rank 0's address as the others
    reach it (:func:`master_host`, from every rank's host name, gathered) and a free port,
    broadcast with mpi4py (imported here: an optional dependency). Returns ``penv``
    unchanged when it has an address or is a single process."""
    if penv.master_addr is not None or penv.world_size == 1:
        return penv
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError(
            f"dnnkit.distributed: started by {penv.source} ({penv.world_size} ranks) without "
            f"MASTER_ADDR and MASTER_PORT: set both (rank 0's host and a free port), or "
            f"install mpi4py so that rank 0 can broadcast them") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != penv.world_size or comm.Get_rank() != penv.rank:
        raise ValueError(f"dnnkit.distributed: MPI says rank {comm.Get_rank()} of "
                         f"{comm.Get_size()}, the environment rank {penv.rank} of "
                         f"{penv.world_size}")
    import socket
    names = comm.allgather(socket.gethostname())
    addr = port = None
    if penv.rank == 0:
        addr, port = master_host(names), free_port()
    addr, port = comm.bcast((addr, port), root=0)
    return penv._replace(master_addr=addr, master_port=port)


def _resolve(name):
    import socket
    return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]


def master_host(names, resolve=_resolve):
    """The address at which the other ranks reach rank 0's store, from every rank's host name
    (``names``, by rank; rank 0's first): 127.0.0.1 when they all run on rank 0's host; else
    rank 0's own address on the route to the first rank elsewhere (a UDP socket "connected"
    to that rank's address sends nothing and tells which local address the kernel would use
    to reach it); rank 0's host name when no such address is found. (``socket.getfqdn()``
    is not enough: on a host whose name maps to a loopback address -- Debian's 127.0.1.1, or
    "localhost" -- it hands the other hosts an address that is their own.)"""
    import socket
    others = [n for n in dict.fromkeys(names[1:]) if n != names[0]]
    if not others:
        return "127.0.0.1"
    for name in others:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((resolve(name), 9))
                local = s.getsockname()[0]
        except OSError:
            continue
        if not local.startswith("127."):
            return local
    return socket.gethostname()


def free_port():
    """A TCP port free on this host now (the operating system's choice)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
