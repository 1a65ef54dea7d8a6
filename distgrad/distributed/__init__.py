"""Distributed features with PyTorch's names (``torch.distributed`` equivalent).

Process groups and collectives (``init_process_group``, ``all_reduce``, ...) live in
``process_group.py``, ``collectives.py``, ``point_to_point.py`` and
``object_collectives.py``, the key-value stores in ``store.py`` and
``file_store.py``; ``rpc`` is ``torch.distributed.rpc``. ``autograd``, ``optim``,
``nn`` and ``pipelining`` load on first use. ``DistributedDataParallel`` is implemented in
``ddp.py``.
"""
from . import rpc  # noqa: F401
from .collectives import (all_gather, all_gather_into_tensor, all_reduce, all_to_all,
                          all_to_all_single, barrier, broadcast, gather, monitored_barrier, reduce,
                          reduce_scatter, reduce_scatter_tensor, scatter)
from .point_to_point import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .object_collectives import (all_gather_object, broadcast_object_list, gather_object,
                                 recv_object_list, scatter_object_list, send_object_list)
from .work import Work
from .errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from .process_group import (Backend, GroupMember, ProcessGroup, default_pg_timeout,
                            destroy_process_group, get_backend, get_global_rank, get_group_rank,
                            get_process_group_ranks, get_rank, get_world_size, group,
                            init_process_group, is_available, is_backend_available,
                            is_gloo_available, is_initialized, is_mpi_available,
                            is_nccl_available, is_torchelastic_launched, is_ucc_available,
                            new_group)
from .reduce_op import ReduceOp, reduce_op
from .file_store import FileStore
from .store import HashStore, PrefixStore, Store, TCPStore


from . import ddp as _ddp  # noqa: F401 - DistributedDataParallel's implementation registers
from ..rpc.allowlist import register_entry_point_modules as _register_entry_point_modules
from ..utils.data.distributed import use_default_group as _use_default_group
from ..utils.lazy import submodules_on_first_use as _submodules_on_first_use

_use_default_group(get_rank, get_world_size)  # DistributedSampler's rank and world size
# what peers call on a worker for distributed autograd, RemoteModule, DistributedOptimizer
_register_entry_point_modules(
    "distgrad.distributed.autograd.recording", "distgrad.distributed.autograd.engine",
    "distgrad.distributed.autograd.hooks", "distgrad.distributed.nn.remote_module",
    "distgrad.distributed.optim.optimizer")

# autograd, optim and nn load on first use (they install the RPC message interceptor)
__getattr__ = _submodules_on_first_use(__name__)
