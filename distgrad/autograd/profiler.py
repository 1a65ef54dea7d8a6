"""``distgrad.autograd.profiler``: PyTorch's ``torch.autograd.profiler``.

``profile`` records the ops, backward nodes and ``record_function`` blocks of the thread
that enters it (and, with RPC, what its calls run on other workers) and answers with
PyTorch's results: ``function_events``, ``key_averages().table()``, ``total_average``,
``export_chrome_trace``. ``emit_nvtx`` and ``emit_itt`` need NVIDIA's and Intel's
libraries, which distgrad has not: they raise.

>>> import distgrad
>>> from distgrad.autograd import profiler
>>> x = distgrad.ones(2, 2, requires_grad=True)
>>> with profiler.profile() as prof:
...     (x @ x).sum().backward()
>>> [e.name for e in prof.function_events][:2]
['aten::matmul', 'aten::sum']
"""
import functools
import uuid
import warnings

from ..futures import Future
from . import profiling, profiler_results, profiler_trace
from .device import CPU_ONLY
from .profiler_util import DeviceType, EventList, FunctionEvent, FunctionEventAvg

__all__ = ["profile", "record_function", "emit_nvtx", "emit_itt", "load_nvprof", "EventList",
           "FunctionEvent", "FunctionEventAvg", "DeviceType", "kineto_available"]

_DEVICES = ("cuda", "xpu", "mtia", "hpu")


def kineto_available():
    """PyTorch's flag for its Kineto profiler; distgrad's profiler writes Kineto's traces."""
    return True


def _check_device(use_device, use_cpu, use_kineto):
    """The device to profile besides the CPU, with PyTorch's warnings: none here."""
    if use_device is not None and use_device not in _DEVICES:
        warnings.warn(f"The {use_device} is not a valid device option.", stacklevel=4)
        use_device = None
    if use_device in ("cuda", "xpu", "hpu"):
        warnings.warn(f"{use_device.upper()} is not available, disabling "
                      f"{use_device.upper()} profiling", stacklevel=4)
        use_device = None
    if use_device == "mtia":
        raise AssertionError("Legacy MTIA profiling is not supported. Requires use_kineto=True "
                             "on MTIA devices.")
    if not use_cpu:
        if not use_kineto:
            raise AssertionError("Device-only events supported only with Kineto "
                                 "(use_kineto=True)")
        raise AssertionError("No activities specified for the profiler")
    return use_device


class profile:
    """Record what this thread runs while the block is open (PyTorch's arguments).

    ``record_shapes``: input shapes, types and scalar values of ops; ``profile_memory``:
    the memory each event allocated, net, as ``tracemalloc`` counts it (NumPy's buffers
    and Python objects); ``with_stack``: Python function events (as PyTorch's Python
    tracer); ``with_flops``: FLOPs of matrix products, convolutions, add and mul.
    """

    def __init__(self, enabled=True, *, use_cuda=False, use_device=None, record_shapes=False,
                 with_flops=False, profile_memory=False, with_stack=False, with_modules=False,
                 use_kineto=False, use_cpu=True, experimental_config=None, acc_events=False,
                 custom_trace_id_callback=None, post_processing_timeout_s=None,
                 activity_filters=None):
        self.enabled = enabled
        if not enabled:
            return
        self.use_cuda = use_cuda
        if use_cuda:
            warnings.warn("The attribute `use_cuda` will be deprecated soon, please use "
                          "``use_device = 'cuda'`` instead.", FutureWarning, stacklevel=2)
            use_device = "cuda"
        if experimental_config is not None:
            raise NotImplementedError("distgrad's profiler has no experimental options: "
                                      "experimental_config must be None")
        if activity_filters:
            raise NotImplementedError("distgrad's profiler records every CPU activity: "
                                      f"activity_filters {activity_filters!r} cannot be applied")
        if post_processing_timeout_s is not None and post_processing_timeout_s < 0:
            raise ValueError("post_processing_timeout_s must be non-negative")
        self.use_device = _check_device(use_device, use_cpu, use_kineto)
        self.record_shapes = record_shapes or with_flops
        self.with_flops, self.profile_memory = with_flops, profile_memory
        self.with_stack, self.with_modules = with_stack, with_modules  # (modules: TorchScript's)
        self.use_cpu, self.acc_events = use_cpu, acc_events
        self.experimental_config = experimental_config
        self.custom_trace_id_callback = custom_trace_id_callback
        self.post_processing_timeout_s = post_processing_timeout_s
        self.entered = False
        self.trace_id = ""
        self._recorder = None
        self._token = None
        self._results = None
        self._old_events = None
        self._function_events = None

    # -- trace ids --
    def default_trace_id(self):
        return f"{uuid.uuid4().int:032X}"

    def create_trace_id(self):
        if self.custom_trace_id_callback:
            return self.custom_trace_id_callback()
        return self.default_trace_id()

    # -- recording --
    def __enter__(self):
        if not self.enabled:
            return None
        if self.entered:
            raise RuntimeError("Profiler context manager is not reentrant")
        self._prepare_trace()
        self._start_trace()
        return self

    def _prepare_trace(self):
        self.entered = True
        self.trace_id = self.create_trace_id()

    def _start_trace(self):
        self.entered = True
        rec = self._recorder = profiling.Recorder(self.record_shapes, self.profile_memory,
                                                  self.with_stack, self.with_flops)
        profiling.register(rec)
        self._token = profiling.attach(rec)

    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled:
            return False
        rec = self._recorder
        if rec is None:
            return False
        profiling.detach(self._token)
        self._token = None
        busy = profiling.settle(rec)  # its RPC handlers here that are finishing
        rec.enabled = False
        if busy:
            rec.warnings.append(f"{busy} thread(s) of this process still served requests of "
                                "the profile when it stopped: what they did next is not in it")
        try:
            profiling.collect(rec)  # what its RPC peers recorded for it
        finally:
            profiling.unregister(rec)
        if self._function_events is not None and self.acc_events:
            self._old_events = self._function_events
        self._function_events = None
        self._results = None
        if self.acc_events:
            self._ensure_function_events()
        return False

    def toggle_collection_dynamic(self, enabled, activities):
        """Pause (``enabled=False``) or resume recording while the profile is open."""
        if self._recorder is not None and not self._recorder.closed:
            self._recorder.enabled = bool(enabled)

    # -- results --
    def _ensure_results(self):
        if self._results is None and self._recorder is not None and self._token is None:
            self._results = profiler_results.build(self._recorder, self.use_device,
                                                   self.profile_memory, self.with_flops)
            for text in self._results.warnings:
                warnings.warn(text, RuntimeWarning, stacklevel=3)
        return self._results

    def _ensure_function_events(self):
        if self._function_events is not None:
            return
        results = self._ensure_results()
        events = EventList(results.events if results is not None else (),
                           use_device=self.use_device, profile_memory=self.profile_memory,
                           with_flops=self.with_flops)
        events._tree_built = True
        if self._old_events and self.acc_events:
            events.extend(self._old_events)
            self._old_events = None
        self._function_events = events

    @property
    def function_events(self):
        self._ensure_function_events()
        return self._function_events

    def __repr__(self):
        if not self.enabled or self._recorder is None or self._token is not None:
            return "<unfinished distgrad.autograd.profile>"
        return repr(self.function_events)

    def __str__(self):
        if not self.enabled or self._recorder is None or self._token is not None:
            return "<unfinished distgrad.autograd.profile>"
        return str(self.function_events)

    def table(self, sort_by=None, row_limit=100, max_src_column_width=75,
              max_name_column_width=55, max_shapes_column_width=80, header=None,
              top_level_events_only=False):
        return self.function_events.table(
            sort_by=sort_by, row_limit=row_limit, max_src_column_width=max_src_column_width,
            max_name_column_width=max_name_column_width,
            max_shapes_column_width=max_shapes_column_width, header=header,
            top_level_events_only=top_level_events_only)

    table.__doc__ = EventList.table.__doc__

    def export_chrome_trace(self, path, metadata=None, use_python_export=False):
        """Write the trace (Kineto's JSON layout; ``.gz``: compressed) to ``path``."""
        results = self._ensure_results()
        if results is None:
            raise RuntimeError("the profiler has no results to export: it has not run and "
                               "stopped yet")
        meta = {"profile_memory": "1"} if self.profile_memory else {}
        meta.update({k: "1" for k in ("with_stack", "record_shapes", "with_flops")
                     if getattr(self, k)})
        meta.update(metadata or {})
        profiler_trace.write(results, path, self.trace_id, meta)

    def export_stacks(self, path, metric="self_cpu_time_total"):
        if not self.with_stack:
            raise AssertionError("export_stacks() requires with_stack=True")
        return self.function_events.export_stacks(path, metric)

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0,
                     group_by_overload_name=False):
        return self.function_events.key_averages(group_by_input_shape, group_by_stack_n,
                                                 group_by_overload_name)

    key_averages.__doc__ = EventList.key_averages.__doc__

    def total_average(self):
        return self.function_events.total_average()

    @property
    def self_cpu_time_total(self):
        """The sum of the self CPU times of all events."""
        return self.function_events.self_cpu_time_total


class record_function:
    """Label a block (or, as a decorator, every call of a function) in the profile.

    A no-op when the thread is not profiled. ``_call_end_callbacks_on_future(fut)`` ends
    the label when ``fut`` completes instead of at the block's end.
    """

    def __init__(self, name, args=None):
        self.name = name
        self.args = args
        self.run_callbacks_on_exit = True
        self._open = None

    def __enter__(self):
        rec = profiling.current()
        self._open = (rec, rec.mark(), profiling.thread_id()) if rec is not None else None
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self.run_callbacks_on_exit:
            self._end()
        return False

    def _end(self):
        opened, self._open = self._open, None
        if opened is not None:
            rec, begin, tid = opened
            if not rec.closed:
                rec.span(profiling.USER, self.name, begin, tid)

    def __call__(self, func):
        @functools.wraps(func)
        def wrapped(*args, **kwargs):
            with record_function(self.name, self.args):
                return func(*args, **kwargs)
        return wrapped

    def _call_end_callbacks_on_future(self, fut):
        """A future of ``fut``'s value that completes once this label has ended."""
        if not self.run_callbacks_on_exit:
            raise RuntimeError("_call_end_callbacks_on_future can only be called once.")
        if not isinstance(fut, Future):
            raise TypeError(f"_call_end_callbacks_on_future takes a Future, not "
                            f"{type(fut).__name__}")
        self.run_callbacks_on_exit = False

        def end(f):
            self._end()
            return f.value()
        return fut.then(end)


class _ExternalRanges:
    """Ranges for an external profiler that distgrad cannot feed: entering raises (unless
    ``enabled=False``, which PyTorch makes a no-op)."""

    why = ""

    def __init__(self, enabled=True, record_shapes=False):
        self.enabled, self.record_shapes = enabled, record_shapes

    def __enter__(self):
        if self.enabled:
            raise RuntimeError(self.why)
        return None

    def __exit__(self, exc_type, exc_val, exc_tb):
        return False


class emit_nvtx(_ExternalRanges):
    """NVTX ranges for NVIDIA's profilers: they need CUDA."""

    why = (f"{CPU_ONLY}: emit_nvtx annotates CUDA work for nvprof/Nsight and there is no "
           "CUDA device (use distgrad.profiler.profile)")


class emit_itt(_ExternalRanges):
    """ITT ranges for Intel VTune: distgrad has no ITT library."""

    why = ("distgrad cannot emit ITT ranges (it has no Intel ITT library): use "
           "distgrad.profiler.profile")


def load_nvprof(path):
    """PyTorch reads an nvprof trace of CUDA kernels here; distgrad has none to read."""
    raise RuntimeError(f"{CPU_ONLY}: load_nvprof reads nvprof traces of CUDA programs "
                       f"({path!r}); profile with distgrad.profiler.profile instead")
