"""Data-parallel replicas of a pipeline stage: the workers' process group and the
averaging of their gradients.

With ``world.replicas`` R > 1 every stage runs on R workers, each on its shard of
every batch (see :mod:`distgrad.launch.grid`). Beside the RPC world, the workers
(not the coordinator, which trains nothing) form a process group through a
``TCPStore`` that the coordinator serves on a port the kernel picks and names in
each stage's setup, so it never collides with the RPC rendezvous or another
launch. Before every optimizer step the replicas of a stage average their
gradients, so they take the same step and stay identical:

- **one stage** (``world.strategy = "ddp"``): the module is wrapped in
  :class:`~distgrad.nn.parallel.DistributedDataParallel`, whose bucketed
  all-reduces overlap the backward pass. Micro-batches run one after the other
  (each forward, then its backward) and all but the last under ``no_sync()``:
  gradient accumulation, averaged once.
- **several stages**: the replicas of stage ``s`` form a group (every worker calls
  ``new_group`` for every stage, in the same order) and average their gradients
  after the step's last backward, one all-reduce per dtype. DDP cannot do this:
  it averages during the first backward after a forward made outside
  ``no_sync()``, while a pipeline stage runs several micro-batches' forwards
  before their backwards, so the backward that must average (the last) does not
  follow its own forward. (PyTorch's pipelining reaches into DDP's reducer,
  ``prepare_for_backward``, for this; distgrad's DDP has no public way to.)

Either way all replicas hold the same bits after the step: the all-reduce's order
of summation is fixed.
"""
import datetime
from contextlib import nullcontext

import distgrad
import distgrad.distributed as dist
from distgrad.nn.parallel import DistributedDataParallel
from distgrad.distributed.rpc import RpcBackendOptions

from .config import heartbeat_interval
from .grid import Grid

__all__ = ["Replicas"]


class Replicas:
    """This worker's membership of the process group of the stages' replicas.

    ``spec`` is the stage's :class:`~distgrad.launch.contracts.PipelineSetup`: its
    ``worker`` index, the grid's ``stages`` and ``replicas``, the coordinator's
    ``store`` address, ``timeout`` and ``heartbeat_timeout``.
    """

    def __init__(self, spec, module):
        grid = Grid(spec.stages * spec.replicas, spec.replicas)
        host, port = spec.store
        hb = spec.heartbeat_timeout
        timeout = spec.timeout or dist.default_pg_timeout.total_seconds()
        self.module = module
        self._store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(
            seconds=spec.rendezvous_timeout))
        if dist.is_initialized():  # a second setup in this process replaces the first
            dist.destroy_process_group()
        # the process group's liveness follows world.heartbeat_timeout, as RPC's does
        dist.init_process_group(
            "gloo", store=self._store, rank=spec.worker, world_size=grid.workers,
            timeout=datetime.timedelta(seconds=timeout),
            pg_options=RpcBackendOptions(heartbeat_interval=heartbeat_interval(hb),
                                         heartbeat_timeout=hb,
                                         simulated_link=spec.simulated_link))
        self.ddp = self.group = None
        if grid.stages == 1:
            self.ddp = DistributedDataParallel(module)
        else:
            groups = [dist.new_group(grid.stage_peers(s)) for s in range(grid.stages)]
            self.group = groups[spec.stage]

    def forward_of(self, micro_batch, count):
        """``(model, context)`` for a training forward of ``micro_batch`` of ``count``:
        DDP, accumulating locally until the last micro-batch; or the module itself."""
        if self.ddp is None:
            return self.module, nullcontext()
        return self.ddp, self.ddp.no_sync() if micro_batch < count - 1 else nullcontext()

    def average_gradients(self):
        """Several stages, after the step's backward passes: every replica holds the
        replicas' mean gradient (with one stage, DDP averages during backward)."""
        by_dtype = {}
        for p in self.module.parameters():
            if p.requires_grad:
                by_dtype.setdefault(p.dtype, []).append(p)
        with distgrad.no_grad():
            for params in by_dtype.values():
                # a parameter without a gradient adds zeros, so every replica sends the same size
                flat = distgrad.cat([(p.grad if p.grad is not None else distgrad.zeros_like(p))
                                     .reshape(-1) for p in params])
                dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group)
                at = 0
                for p in params:
                    n = p.numel()
                    if p.grad is not None:
                        p.grad.copy_(flat[at:at + n].view_as(p.grad))
                    at += n

    def close(self):
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store.close()
