"""dnnkit.distributed: data-parallel training on several GPUs and several hosts, on NCCL.

    import dnnkit.distributed as dist
    dist.init()                                    # from RANK, WORLD_SIZE, LOCAL_RANK, ...
    model = dist.DataParallel(dist.SyncBatchNorm.convert(build_model()))
    sampler = dist.DistributedSampler(len(dataset), shuffle=True, seed=0)
    ...
    dist.destroy()

Start one process per GPU with ``python -m dnnkit.distributed.run --gpus N script.py``, or
under ``mpirun``/``srun`` (docs/distributed.md). The collectives (``all_reduce``,
``broadcast``, ``all_gather``, ``reduce_scatter``) run on NCCL through nccl4py, the optional
extra ``dnnkit[dist]``: this package imports without it, and only a collective across
processes needs it. ``import dnnkit`` does not import this package.

Modules: env (who this process is, the ``dnn.distributed.timeout`` flag), store (the TCP
rendezvous), nccl (the communicators), watchdog (faults), group (init/destroy), collectives,
buckets and data_parallel (DataParallel), sampler, sync_bn, run (the launcher).
"""

from .collectives import all_gather, all_reduce, barrier, broadcast, reduce_scatter
from .data_parallel import DataParallel
from .env import DistributedError, ProcessEnv, from_environ
from .group import (ProcessGroup, current, destroy, destroy_process_group, get_rank,
                    get_world_size, init, init_process_group, is_initialized)
from .sampler import DistributedSampler
from .sync_bn import SyncBatchNorm

__all__ = ["DataParallel", "DistributedError", "DistributedSampler", "ProcessEnv",
           "ProcessGroup", "SyncBatchNorm", "all_gather", "all_reduce", "barrier", "broadcast",
           "current", "destroy", "destroy_process_group", "from_environ", "get_rank",
           "get_world_size", "init", "init_process_group", "is_initialized", "reduce_scatter"]
