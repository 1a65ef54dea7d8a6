"""``distgrad.profiler.profile`` and its schedule: PyTorch's ``torch.profiler``.

A profile cycles through the actions its ``schedule`` returns for each step: nothing,
warming up, recording, and recording then handing the trace to ``on_trace_ready``; each
recording cycle is one :class:`distgrad.autograd.profiler.profile` (as in PyTorch,
where it is Kineto's). Steps are marked ``ProfilerStep#<n>`` when a schedule is given.
Only the CPU exists here: asking for CUDA (or another device) warns as PyTorch's CPU
build does, and leaves the profile without it.
"""
import enum
import functools
import os
import socket
import time
import warnings

from ..autograd import profiler as autograd_profiler

__all__ = ["ProfilerActivity", "ProfilerAction", "schedule", "profile", "_KinetoProfile",
           "tensorboard_trace_handler", "supported_activities", "ExecutionTraceObserver"]

_warned = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


class ProfilerActivity(enum.Enum):
    """What a profile records; only ``CPU`` is there to record in distgrad."""
    CPU = 0
    XPU = 1
    CUDA = 2
    HPU = 3
    MTIA = 4
    PrivateUse1 = 5


def supported_activities():
    """The activities this build can record: the CPU."""
    return {ProfilerActivity.CPU}


class ProfilerAction(enum.Enum):
    """What a profile does at a step (``DEVICE_STOPPED`` is PyTorch's own, never a schedule's)."""
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3
    DEVICE_STOPPED = 4


def schedule(*, wait, warmup, active, repeat=0, skip_first=0, skip_first_wait=0):
    """A schedule for :class:`profile`: skip ``skip_first`` steps, then cycles of ``wait``
    idle steps, ``warmup`` warm-up steps and ``active`` recorded ones (the last of which
    saves the trace), ``repeat`` times (0: until the profile ends). ``skip_first_wait``
    leaves out the first cycle's wait."""
    if wait < 0 or warmup < 0 or active <= 0 or repeat < 0 or skip_first < 0:
        raise AssertionError(
            f"Invalid profiler schedule arguments. Got wait={wait} (need >= 0), "
            f"warmup={warmup} (need >= 0), active={active} (need > 0), repeat={repeat} "
            f"(need >= 0), skip_first={skip_first} (need >= 0).")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results",
                      stacklevel=2)
    cycle = wait + warmup + active

    def schedule_fn(step):
        if step < 0:
            raise AssertionError(f"Step must be non-negative. Got {step}.")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:
            step += wait
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        position = step % cycle
        if position < wait:
            return ProfilerAction.NONE
        if position < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if position < cycle - 1 else ProfilerAction.RECORD_AND_SAVE
    return schedule_fn


def _always_record(step):
    return ProfilerAction.RECORD


def tensorboard_trace_handler(dir_name, worker_name=None, use_gzip=False,
                              use_python_export=False):
    """An ``on_trace_ready`` that writes each trace to ``dir_name`` as
    ``<worker>.<ns>.pt.trace.json[.gz]``, for TensorBoard's profiler plugin (``worker``:
    ``<host>_<pid>`` unless given; unique per worker)."""
    def handler_fn(prof):
        nonlocal worker_name
        if not os.path.isdir(dir_name):
            try:
                os.makedirs(dir_name, exist_ok=True)
            except OSError as e:
                raise RuntimeError("Can't create directory: " + dir_name) from e
        if not worker_name:
            worker_name = f"{socket.gethostname()}_{os.getpid()}"
        name = f"{worker_name}.{time.time_ns()}.pt.trace.json" + (".gz" if use_gzip else "")
        prof.export_chrome_trace(os.path.join(dir_name, name),
                                 use_python_export=use_python_export)
    return handler_fn


def _parse_activities(activities):
    found, filters = set(), {}
    for item in activities:
        if isinstance(item, ProfilerActivity):
            keys = [item]
        elif isinstance(item, dict):
            keys = list(item)
            filters.update({k: set(v) for k, v in item.items()})
        else:
            raise TypeError(f"Expected ProfilerActivity or dict, got {type(item)}")
        for key in keys:
            if key in found:
                raise ValueError(f"Activity {key} specified more than once")
            found.add(key)
    return found, filters


class _KinetoProfile:
    """The recording part of :class:`profile`, without a schedule (PyTorch's class)."""

    def __init__(self, *, activities=None, record_shapes=False, profile_memory=False,
                 with_stack=False, with_flops=False, with_modules=False,
                 experimental_config=None, execution_trace_observer=None, acc_events=False,
                 custom_trace_id_callback=None, post_processing_timeout_s=None):
        if activities is not None:
            self.activities, self.activity_filters = _parse_activities(activities)
        else:
            self.activities, self.activity_filters = supported_activities(), {}
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.with_stack, self.with_flops, self.with_modules = with_stack, with_flops, with_modules
        self.experimental_config = experimental_config
        self.execution_trace_observer = execution_trace_observer
        self.acc_events = acc_events
        self.custom_trace_id_callback = custom_trace_id_callback
        self.post_processing_timeout_s = post_processing_timeout_s
        self.profiler = None
        self.use_device = None
        for activity, device in ((ProfilerActivity.CUDA, "cuda"), (ProfilerActivity.XPU, "xpu"),
                                 (ProfilerActivity.MTIA, "mtia"), (ProfilerActivity.HPU, "hpu"),
                                 (ProfilerActivity.PrivateUse1, "privateuseone")):
            if activity in self.activities:
                self.use_device = device
                break
        self.preset_metadata = {}
        self._trace_metadata = {}

    def start(self):
        self.prepare_trace()
        self.start_trace()

    def stop(self):
        self.stop_trace()

    def prepare_trace(self):
        if self.profiler is not None and not self.acc_events:
            _warn_once("Warning: Profiler clears events at the end of each cycle. Only events "
                       "from the current cycle will be reported. To keep events across "
                       "cycles, set acc_events=True.")
        if self.profiler is None or not self.acc_events:
            filters = {k: v for k, v in self.activity_filters.items()
                       if k == ProfilerActivity.CPU}
            self.profiler = autograd_profiler.profile(
                use_cpu=ProfilerActivity.CPU in self.activities, use_device=self.use_device,
                record_shapes=self.record_shapes, with_flops=self.with_flops,
                profile_memory=self.profile_memory, with_stack=self.with_stack,
                with_modules=self.with_modules, use_kineto=True,
                experimental_config=self.experimental_config, acc_events=self.acc_events,
                custom_trace_id_callback=self.custom_trace_id_callback,
                post_processing_timeout_s=self.post_processing_timeout_s,
                activity_filters=filters or None)
        self.profiler._prepare_trace()

    def start_trace(self):
        if self.execution_trace_observer:
            self.execution_trace_observer.start()
        self.profiler._start_trace()
        for flag in ("profile_memory", "with_stack", "record_shapes", "with_modules",
                     "with_flops"):
            if getattr(self, flag):
                self.add_metadata_json(flag, "1")
        for key, value in self.preset_metadata.items():
            self.add_metadata_json(key, value)

    def stop_trace(self):
        if self.execution_trace_observer:
            self.execution_trace_observer.stop()
        self.profiler.__exit__(None, None, None)

    def export_chrome_trace(self, path, use_python_export=False):
        """Write the last cycle's trace to ``path`` (``.gz``: compressed)."""
        if self.profiler is None:
            raise AssertionError("Profiler must be initialized before exporting chrome trace")
        self.profiler.export_chrome_trace(path, self._trace_metadata)

    def export_stacks(self, path, metric="self_cpu_time_total"):
        if self.profiler is None:
            raise AssertionError("Profiler must be initialized before exporting stacks")
        return self.profiler.export_stacks(path, metric)

    def toggle_collection_dynamic(self, enable, activities):
        """Pause or resume recording (the CPU's: there is nothing else)."""
        if self.profiler is not None and ProfilerActivity.CPU in set(activities):
            self.profiler.toggle_collection_dynamic(enable, activities)

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0,
                     group_by_overload_name=False):
        """The events averaged by name (and, if asked, input shapes, stack, overload)."""
        if self.profiler is None:
            raise AssertionError("Profiler must be initialized before getting key averages")
        return self.profiler.key_averages(group_by_input_shape, group_by_stack_n,
                                          group_by_overload_name)

    def events(self):
        """The unaggregated events of the last cycle (an EventList of FunctionEvent)."""
        if self.profiler is None:
            raise AssertionError("Profiler must be initialized before accessing events")
        return self.profiler.function_events

    def add_metadata(self, key, value):
        """A string ``value`` under ``key`` in the trace file."""
        self._trace_metadata[key] = '"' + value.replace('"', '\\"') + '"'

    def add_metadata_json(self, key, value):
        """A JSON text ``value`` under ``key`` in the trace file."""
        self._trace_metadata[key] = value

    def preset_metadata_json(self, key, value):
        """Metadata added when recording starts."""
        self.preset_metadata[key] = value

    def export_memory_timeline(self, path, device=None):
        raise NotImplementedError("distgrad's profiler has no memory timeline: it counts the "
                                  "memory of each event (profile_memory=True, the table's CPU "
                                  "Mem columns), not the categories PyTorch plots")


class profile(_KinetoProfile):
    """Profile a block (PyTorch's ``torch.profiler.profile``); see the module's doc.

    >>> import distgrad
    >>> from distgrad.profiler import profile, schedule
    >>> x = distgrad.ones(3, 3)
    >>> with profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as p:
    ...     for _ in range(2):
    ...         y = x @ x
    ...         p.step()
    >>> sorted({e.name for e in p.events()})
    ['ProfilerStep*', 'aten::matmul']
    """

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None,
                 record_shapes=False, profile_memory=False, with_stack=False, with_flops=False,
                 with_modules=False, experimental_config=None, execution_trace_observer=None,
                 acc_events=False, use_cuda=None, custom_trace_id_callback=None,
                 post_processing_timeout_s=None):
        if activities is not None:
            wanted = set()
            for item in activities:
                wanted.update(item.keys() if isinstance(item, dict) else [item])
        else:
            wanted = supported_activities()
        if use_cuda is not None:  # (as in PyTorch, it only takes part in this check)
            warnings.warn("`use_cuda` is deprecated, use `activities` argument instead",
                          FutureWarning, stacklevel=2)
            if use_cuda:
                wanted.add(ProfilerActivity.CUDA)
            else:
                wanted.discard(ProfilerActivity.CUDA)
        if not wanted:
            raise AssertionError("No valid profiler activities found")
        super().__init__(activities=activities, record_shapes=record_shapes,
                         profile_memory=profile_memory, with_stack=with_stack,
                         with_flops=with_flops, with_modules=with_modules,
                         experimental_config=experimental_config,
                         execution_trace_observer=execution_trace_observer,
                         acc_events=acc_events, custom_trace_id_callback=custom_trace_id_callback,
                         post_processing_timeout_s=post_processing_timeout_s)
        self.record_steps = schedule is not None
        self.schedule = schedule or _always_record
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.step_rec_fn = None
        self.current_action = self._scheduled(0)
        A = ProfilerAction
        start = [self.prepare_trace, self.start_trace]
        save = [self.stop_trace, self._trace_ready]
        self.action_map = {
            (A.NONE, A.WARMUP): [self.prepare_trace],
            (A.NONE, A.RECORD): start, (A.NONE, A.RECORD_AND_SAVE): start,
            (A.WARMUP, A.NONE): [functools.partial(warnings.warn, "Incorrect schedule: WARMUP "
                                                   "followed by NONE"),
                                 self.start_trace, self.stop_trace],
            (A.WARMUP, A.RECORD): [self.start_trace],
            (A.WARMUP, A.RECORD_AND_SAVE): [self.start_trace],
            (A.RECORD, A.NONE): [functools.partial(warnings.warn, "Incorrect schedule: RECORD "
                                                   "followed by NONE"), self.stop_trace],
            (A.RECORD, A.WARMUP): [functools.partial(warnings.warn, "Incorrect schedule: "
                                                     "RECORD followed by WARMUP"),
                                   self.stop_trace],
            (A.RECORD_AND_SAVE, A.NONE): save,
            (A.RECORD_AND_SAVE, A.WARMUP): save + [self.prepare_trace],
            (A.RECORD_AND_SAVE, A.RECORD): save + start,
            (A.RECORD_AND_SAVE, A.RECORD_AND_SAVE): save + start,
            (A.WARMUP, None): [self.start_trace, self.stop_trace],
            (A.RECORD, None): save, (A.RECORD_AND_SAVE, None): save,
        }

    def _scheduled(self, step):
        action = self.schedule(step)
        if action == ProfilerAction.DEVICE_STOPPED:
            raise ValueError("ProfilerAction.DEVICE_STOPPED is set internally by the profiler "
                             "and must not be returned by a user-provided schedule")
        return action

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()
        if self.execution_trace_observer:
            self.execution_trace_observer.cleanup()

    def start(self):
        self._transit_action(ProfilerAction.NONE, self.current_action)
        if self.record_steps:
            self.step_rec_fn = autograd_profiler.record_function(f"ProfilerStep#{self.step_num}")
            self.step_rec_fn.__enter__()

    def stop(self):
        if self.record_steps and self.step_rec_fn:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None
        self._transit_action(self.current_action, None)

    def step(self):
        """Mark the start of the next step (the schedule decides what happens now)."""
        if self.record_steps and self.step_rec_fn:
            self.step_rec_fn.__exit__(None, None, None)
            self.step_rec_fn = None
        previous = self.current_action
        action = self._scheduled(self.step_num + 1)
        self.step_num += 1
        self.current_action = action
        self._transit_action(previous, action)
        if self.record_steps:
            self.step_rec_fn = autograd_profiler.record_function(f"ProfilerStep#{self.step_num}")
            self.step_rec_fn.__enter__()

    def set_custom_trace_id_callback(self, callback):
        self.custom_trace_id_callback = callback

    def get_trace_id(self):
        return self.profiler.trace_id if self.profiler is not None else None

    def _trace_ready(self):
        if self.on_trace_ready:
            self.on_trace_ready(self)

    def _transit_action(self, previous, current):
        for action in self.action_map.get((previous, current), ()):
            action()


class ExecutionTraceObserver:
    """PyTorch's execution-trace recorder (a graph of every op, for replay tools): distgrad
    does not write execution traces."""

    def __init__(self):
        raise NotImplementedError("distgrad does not record PyTorch execution traces; use "
                                  "profile(...).export_chrome_trace for a timeline")
