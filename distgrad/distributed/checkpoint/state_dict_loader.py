"""``load`` (and the deprecated ``load_state_dict``): every rank calls it with the state
dict to fill (SPMD). Tensors are filled in place (read straight into their memory);
other values are replaced; a Stateful value's ``state_dict()`` is filled and handed to
its ``load_state_dict``.

Each rank reads what its own state dict asks for, from whichever rank's file holds
it, so a checkpoint of replicated state (a DDP model and its optimizer) loads onto
any number of ranks, also onto one process (``no_dist``).
"""
import inspect
import warnings

from ._coordination import Coordination, alone
from .default_planner import DefaultLoadPlanner
from .filesystem import storage_setup
from .planner import load_plan_from_data, load_plan_to_data
from .stateful import Stateful
from .storage import positional_storage

__all__ = ["load", "load_state_dict"]


@positional_storage
def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, no_dist=False):
    """Fill ``state_dict`` from the checkpoint (see the module docstring). Every rank must
    pass the same keys."""
    no_dist = alone(no_dist, "load", stacklevel=3)  # 3: past positional_storage
    storage_reader = storage_setup(storage_reader, checkpoint_id, reader=True)
    keys = sorted(state_dict)  # every rank visits the values in one order
    own = {k: state_dict[k].state_dict() if isinstance(state_dict[k], Stateful)
           else state_dict[k] for k in keys}
    _load_state_dict(own, storage_reader, process_group, no_dist=no_dist, planner=planner)
    for k in keys:
        if isinstance(state_dict[k], Stateful):
            state_dict[k].load_state_dict(own[k])
        else:
            state_dict[k] = own[k]


def load_state_dict(state_dict, storage_reader, process_group=None, coordinator_rank=0,
                    no_dist=False, planner=None):
    """Deprecated: use :func:`load`."""
    warnings.warn("`load_state_dict` is deprecated and will be removed in future versions. "
                  "Please use `load` instead.", FutureWarning, stacklevel=2)
    storage_reader.reset()
    return _load_state_dict(state_dict, storage_reader, process_group, coordinator_rank,
                            no_dist, planner)


def _read_metadata(storage_reader, rank):
    try:
        return storage_reader.read_metadata()
    except FileNotFoundError:
        if "kwargs" not in inspect.signature(storage_reader.read_metadata).parameters:
            raise
        return storage_reader.read_metadata(rank=rank)  # a save without collectives


def _load_state_dict(state_dict, storage_reader, process_group=None, coordinator_rank=0,
                     no_dist=False, planner=None):
    coord = Coordination(process_group, not no_dist, coordinator_rank)
    planner = planner if planner is not None else DefaultLoadPlanner()

    def local_step():
        metadata = _read_metadata(storage_reader, coord.rank)
        planner.set_up_planner(state_dict, metadata, coord.is_coordinator)
        if "kwargs" in inspect.signature(storage_reader.set_up_storage_reader).parameters:
            storage_reader.set_up_storage_reader(metadata, coord.is_coordinator, rank=coord.rank)
        else:
            storage_reader.set_up_storage_reader(metadata, coord.is_coordinator)
        return storage_reader.prepare_local_plan(planner.create_local_plan())

    def global_step(all_plans):
        return storage_reader.prepare_global_plan(planner.create_global_plan(all_plans))

    central_plan = coord.reduce_scatter("plan", local_step, global_step, load_plan_to_data,
                                        load_plan_from_data)

    def read_data():
        reads = storage_reader.read_data(planner.finish_plan(central_plan), planner)
        reads.wait()

    coord.all_gather("read", read_data)
