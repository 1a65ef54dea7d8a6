"""``save``, ``async_save`` (and the deprecated ``save_state_dict``): every rank calls
them with its state dict (SPMD); each writes its share (replicated values once in all)
into its own files, and rank 0 then writes the metadata that makes the checkpoint.

    >>> import distgrad, tempfile
    >>> import distgrad.distributed.checkpoint as dcp
    >>> model = distgrad.nn.Linear(3, 2)
    >>> path = tempfile.mkdtemp()
    >>> _ = dcp.save({"model": model}, checkpoint_id=path, no_dist=True)
"""
import concurrent.futures
import inspect
import warnings
from dataclasses import dataclass
from enum import Enum

from ._coordination import Coordination, alone
from .default_planner import DefaultSavePlanner
from .filesystem import _staged_copy, storage_setup
from .metadata import metadata_from_data, metadata_to_data
from .planner import save_plan_from_data, save_plan_to_data
from .stateful import Stateful
from .storage import positional_storage, write_results_from_data, write_results_to_data

__all__ = ["save", "async_save", "save_state_dict", "AsyncCheckpointerType", "AsyncSaveResponse"]

class AsyncCheckpointerType(Enum):
    THREAD = "thread"
    PROCESS = "process"


@dataclass
class AsyncSaveResponse:
    """What ``async_save`` returns when staging itself is asynchronous (a stager whose
    ``stage`` returns a Future): both steps' futures."""
    staging_completion: concurrent.futures.Future
    upload_completion: concurrent.futures.Future


def _stateful_to_state_dict(state_dict):
    """A shallow copy in which every Stateful value is replaced by its ``state_dict()``."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


@positional_storage
def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
         process_group=None, no_dist=False, use_collectives=True):
    """Save ``state_dict`` (values: tensors, Stateful objects such as modules and
    optimizers, anything ``distgrad.save`` takes, nested in dicts and lists) on every
    rank of ``process_group`` (default: the default group; none initialized, or
    ``no_dist``: this process alone). Returns the checkpoint's :class:`Metadata`.

    ``use_collectives=False``: each rank saves alone, with metadata of its own
    (``__<rank>.metadata``), which only that rank can load.
    """
    no_dist = alone(no_dist, "save", stacklevel=3)  # 3: the caller of positional_storage's
    storage_writer = storage_setup(storage_writer, checkpoint_id, reader=False)
    return _save_state_dict(_stateful_to_state_dict(state_dict), storage_writer, process_group,
                            no_dist=no_dist, planner=planner, use_collectives=use_collectives)


def save_state_dict(state_dict, storage_writer, process_group=None, coordinator_rank=0,
                    no_dist=False, planner=None):
    """Deprecated: use :func:`save`."""
    warnings.warn("`save_state_dict` is deprecated and will be removed in future versions."
                  "Please use `save` instead.", FutureWarning, stacklevel=2)
    storage_writer.reset()
    return _save_state_dict(state_dict, storage_writer, process_group, coordinator_rank,
                            no_dist, planner)


def _save_state_dict(state_dict, storage_writer, process_group=None, coordinator_rank=0,
                     no_dist=False, planner=None, use_collectives=True):
    coord = Coordination(process_group, not no_dist, coordinator_rank)
    planner = planner if planner is not None else DefaultSavePlanner()
    global_metadata = None

    def local_step():
        storage_meta = storage_writer.storage_meta()
        if "storage_meta" in inspect.signature(planner.set_up_planner).parameters:
            planner.set_up_planner(state_dict=state_dict, storage_meta=storage_meta,
                                   is_coordinator=coord.is_coordinator)
        else:
            warnings.warn("The function definition for SavePlanner.set_up_planner has been "
                          "updated to include the storage_meta argument. Please update your "
                          "implementation to include this parameter.", stacklevel=2)
            planner.set_up_planner(state_dict, coord.is_coordinator)
        if "kwargs" in inspect.signature(storage_writer.set_up_storage_writer).parameters:
            storage_writer.set_up_storage_writer(coord.is_coordinator, rank=coord.rank,
                                                 use_collectives=use_collectives)
        else:
            storage_writer.set_up_storage_writer(coord.is_coordinator)
        return storage_writer.prepare_local_plan(planner.create_local_plan())

    def global_step(all_plans):
        nonlocal global_metadata
        all_plans, global_metadata = planner.create_global_plan(all_plans)
        return storage_writer.prepare_global_plan(all_plans)

    def write_data():
        writes = storage_writer.write_data(planner.finish_plan(central_plan), planner)
        writes.wait()
        return writes.value()

    def finish_checkpoint(all_results):
        storage_writer.finish(metadata=global_metadata, results=all_results)
        return global_metadata

    if use_collectives:
        central_plan = coord.reduce_scatter("plan", local_step, global_step, save_plan_to_data,
                                            save_plan_from_data)
        return coord.all_reduce("write", write_data, finish_checkpoint, write_results_to_data,
                                write_results_from_data, metadata_to_data, metadata_from_data)
    local = Coordination(None, False)  # this rank alone, failures still as CheckpointException
    central_plan = local.reduce_scatter("plan", local_step, global_step, lambda p: p,
                                        lambda p: p)
    metadata = local.all_reduce("write", write_data, finish_checkpoint, lambda r: r, lambda r: r)
    coord.barrier()
    return metadata


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
               process_group=None, async_checkpointer_type=AsyncCheckpointerType.THREAD,
               async_stager=None, no_dist=False, use_collectives=True):
    """:func:`save` in a background thread, after copying every tensor (staging), so
    training can go on changing them. Returns a ``concurrent.futures.Future`` of the
    Metadata (an :class:`AsyncSaveResponse` when ``async_stager.stage`` returns a Future).

    The save runs collectives on ``process_group``: give it a group of its own
    (``dist.new_group()``) when the training issues collectives meanwhile, as
    PyTorch's asynchronous checkpointing recipe does.
    """
    if async_checkpointer_type == AsyncCheckpointerType.PROCESS:
        raise NotImplementedError("async_save: AsyncCheckpointerType.PROCESS (saving from a "
                                  "separate process) is not supported by distgrad; use THREAD")
    state_dict = _stateful_to_state_dict(state_dict)
    stager = async_stager
    if stager is None and hasattr(storage_writer, "stage"):
        stager = storage_writer
    staged = stager.stage(state_dict) if stager is not None else _staged_copy(state_dict)
    no_dist = alone(no_dist, "save", stacklevel=2)
    storage_writer = storage_setup(storage_writer, checkpoint_id, reader=False)

    def upload():
        sd = staged.result() if isinstance(staged, concurrent.futures.Future) else staged
        return _save_state_dict(sd, storage_writer, process_group, no_dist=no_dist,
                                planner=planner, use_collectives=use_collectives)
    # one thread per save, owned by its executor: it ends with the save, and
    # interpreter exit waits for it (an unfinished checkpoint is never left behind
    # silently)
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dcp-async-save")
    try:
        upload_future = executor.submit(upload)
    finally:
        executor.shutdown(wait=False)
    if isinstance(staged, concurrent.futures.Future):
        staging_done = concurrent.futures.Future()
        staged.add_done_callback(lambda f: staging_done.set_exception(f.exception())
                                 if f.exception() else staging_done.set_result(None))
        return AsyncSaveResponse(staging_done, upload_future)
    return upload_future
