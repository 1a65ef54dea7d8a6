"""The profiler's results: ``FunctionEvent``, ``FunctionEventAvg`` and ``EventList``.

The classes of ``torch.autograd.profiler_util`` with their attributes and behaviour:
events nest by time within a thread of a node (``cpu_parent``/``cpu_children``), *self*
times and memory are an event's minus its children's, ``key_averages`` groups by name,
node, device, legacy and annotation flags (and optionally input shapes, stack entries,
overload), ``table`` prints PyTorch's columns (``profiler_table.py``).

distgrad runs on the CPU only: device times are 0, and an event is on ``DeviceType.CPU``.
"""
import enum
import itertools
import json
from collections import defaultdict
from operator import attrgetter

from .profiler_table import build_table, format_time

__all__ = ["DeviceType", "EventList", "FunctionEvent", "FunctionEventAvg", "Interval", "Kernel",
           "FormattedTimesMixin", "MEMORY_EVENT_NAME"]

MEMORY_EVENT_NAME = "[memory]"
BACKWARD_FUNCTION = 1  # the RecordScope of a backward node's own event


class DeviceType(enum.IntEnum):
    """PyTorch's device types (``torch.autograd.DeviceType``); events here are all CPU."""
    CPU = 0
    CUDA = 1
    MKLDNN = 2
    OPENGL = 3
    OPENCL = 4
    IDEEP = 5
    HIP = 6
    FPGA = 7
    MAIA = 8
    XLA = 9
    Vulkan = 10
    Metal = 11
    XPU = 12
    MPS = 13
    Meta = 14
    HPU = 15
    VE = 16
    Lazy = 17
    IPU = 18
    MTIA = 19
    PrivateUse1 = 20


class Interval:
    """``[start, end)`` in microseconds since the profile started."""

    def __init__(self, start, end):
        self.start = start
        self.end = end

    def elapsed_us(self):
        return self.end - self.start


class Kernel(tuple):
    """A device kernel an event launched (never, on the CPU): ``(name, device, duration)``."""

    def __new__(cls, name, device, duration):
        return super().__new__(cls, (name, device, duration))

    name = property(lambda self: self[0])
    device = property(lambda self: self[1])
    duration = property(lambda self: self[2])


def _time_str(attr):
    return property(lambda self: format_time(getattr(self, attr)))


class FormattedTimesMixin:
    """``*_str`` renderings and per-call averages of an event's (or an average's) times."""

    cpu_time_str = _time_str("cpu_time")
    device_time_str = _time_str("device_time")
    cpu_time_total_str = _time_str("cpu_time_total")
    device_time_total_str = _time_str("device_time_total")
    self_cpu_time_total_str = _time_str("self_cpu_time_total")
    self_device_time_total_str = _time_str("self_device_time_total")

    @property
    def cpu_time(self):
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self):
        return self.device_time_total / self.count if self.count else 0.0

    @property
    def cuda_time(self):
        return self.device_time


class FunctionEvent(FormattedTimesMixin):
    """One recorded call: an op, a backward node, a ``record_function`` block, a Python
    function (``with_stack``), or an RPC. Times are in microseconds."""

    kind = None        # what recorded it (``profiling.OP``...), for traces
    trace_ids = None   # (pid, native thread id, trace category), for traces
    python_id = python_parent_id = -1
    flow_id = None

    def __init__(self, id, name, thread, start_us, end_us, overload_name="", fwd_thread=None,
                 input_shapes=None, stack=None, scope=0, use_device=None, cpu_memory_usage=0,
                 device_memory_usage=0, is_async=False, is_remote=False, sequence_nr=-1,
                 node_id=-1, device_type=DeviceType.CPU, device_index=0,
                 device_resource_id=None, is_legacy=False, flops=None, trace_name=None,
                 concrete_inputs=None, kwinputs=None, is_user_annotation=False,
                 is_python_function=False, input_dtypes=None):
        self.id = id
        self.node_id = node_id
        self.name = name
        self.overload_name = overload_name
        self.trace_name = trace_name if trace_name is not None else name
        self.time_range = Interval(start_us, end_us)
        self.thread = thread
        self.fwd_thread = fwd_thread
        self.kernels = []
        self.count = 1
        self.cpu_children = []
        self.cpu_parent = None
        self.input_shapes = input_shapes if input_shapes is not None else []
        self.concrete_inputs = concrete_inputs if concrete_inputs is not None else []
        self.kwinputs = kwinputs if kwinputs is not None else {}
        self.input_dtypes = input_dtypes if input_dtypes is not None else []
        self.stack = stack if stack is not None else []
        self.scope = scope
        self.use_device = use_device
        self.cpu_memory_usage = cpu_memory_usage
        self.device_memory_usage = device_memory_usage
        self.is_async = is_async
        self.is_remote = is_remote
        self.sequence_nr = sequence_nr
        self.device_type = device_type
        self.device_index = device_index
        self.device_resource_id = thread if device_resource_id is None else device_resource_id
        self.is_legacy = is_legacy
        self.flops = flops
        self.is_user_annotation = is_user_annotation
        self.is_python_function = is_python_function
        self.self_cpu_percent = -1
        self.total_cpu_percent = -1
        self.total_device_percent = -1

    def append_kernel(self, name, device, duration):
        self.kernels.append(Kernel(name, device, duration))

    def append_cpu_child(self, child):
        """Add a direct child (one whose interval lies within this one, on its thread)."""
        if not isinstance(child, FunctionEvent):
            raise TypeError(f"a CPU child must be a FunctionEvent, not {type(child).__name__}")
        self.cpu_children.append(child)

    def set_cpu_parent(self, parent):
        if not isinstance(parent, FunctionEvent):
            raise TypeError(f"a CPU parent must be a FunctionEvent, not {type(parent).__name__}")
        self.cpu_parent = parent

    @property
    def cpu_time_total(self):
        return self.time_range.elapsed_us()

    @property
    def self_cpu_time_total(self):
        if self.is_async:
            return 0
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    @property
    def self_cpu_memory_usage(self):
        if self.is_async:
            return 0
        return self.cpu_memory_usage - sum(c.cpu_memory_usage for c in self.cpu_children)

    @property
    def self_device_memory_usage(self):
        return 0

    @property
    def device_time_total(self):
        return 0

    @property
    def self_device_time_total(self):
        return 0

    cuda_time_total = device_time_total
    self_cuda_time_total = self_device_time_total
    self_cuda_memory_usage = self_device_memory_usage

    @property
    def key(self):
        return self.name

    def __repr__(self):
        return (f"<FunctionEvent id={self.id} name={self.name} overload_name={self.overload_name} "
                f"device_type={self.device_type} node_id={self.node_id} "
                f"cpu_time={self.cpu_time_str} start_us={self.time_range.start} "
                f"end_us={self.time_range.end} "
                f"cpu_children={[c.id for c in self.cpu_children]} "
                f"{self.use_device}_time={self.device_time_str} name={self.name} "
                f"thread={self.thread} input_shapes={self.input_shapes} "
                f"cpu_memory_usage={self.cpu_memory_usage} "
                f"{self.use_device}_memory_usage={self.device_memory_usage} "
                f"is_async={self.is_async} is_remote={self.is_remote} "
                f"seq_nr={self.sequence_nr} is_legacy={self.is_legacy}>")


class FunctionEventAvg(FormattedTimesMixin):
    """Totals of the events that share a key (:meth:`EventList.key_averages`)."""

    def __init__(self):
        self.key = None
        self.count = 0
        self.node_id = 0
        self.is_async = False
        self.is_remote = False
        self.use_device = None
        self.cpu_time_total = 0
        self.device_time_total = 0
        self.self_cpu_time_total = 0
        self.self_device_time_total = 0
        self.input_shapes = None
        self.overload_name = None
        self.stack = None
        self.scope = None
        self.cpu_memory_usage = 0
        self.device_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.self_device_memory_usage = 0
        self.cpu_children = None
        self.cpu_parent = None
        self.device_type = DeviceType.CPU
        self.is_legacy = False
        self.is_user_annotation = False
        self.flops = 0

    def add(self, other):
        if not isinstance(other, (FunctionEvent, FunctionEventAvg)):
            raise TypeError("FunctionEventAvg.add takes a FunctionEvent or a FunctionEventAvg, "
                            f"not {type(other).__name__}")
        if self.key is None:  # the first one gives the shared fields
            for attr in ("key", "node_id", "is_async", "is_remote", "cpu_parent", "cpu_children",
                         "overload_name", "input_shapes", "stack", "scope", "device_type",
                         "is_legacy", "use_device", "is_user_annotation"):
                setattr(self, attr, getattr(other, attr))
        elif other.key != self.key:
            raise ValueError(f"cannot average events of different keys: {other.key!r} into "
                             f"{self.key!r}")
        for attr in ("cpu_time_total", "device_time_total", "self_cpu_time_total",
                     "self_device_time_total", "cpu_memory_usage", "device_memory_usage",
                     "self_cpu_memory_usage", "self_device_memory_usage", "count"):
            setattr(self, attr, getattr(self, attr) + getattr(other, attr))
        if other.flops is not None:
            self.flops = (self.flops or 0) + other.flops
        return self

    __iadd__ = add

    def __repr__(self):
        device = self.use_device or "cuda"
        return (f"<FunctionEventAvg key={self.key} self_cpu_time={self.self_cpu_time_total_str} "
                f"cpu_time={self.cpu_time_str}  self_{device}_time="
                f"{self.self_device_time_total_str} {device}_time={self.device_time_str} "
                f"input_shapes={self.input_shapes} cpu_memory_usage={self.cpu_memory_usage} "
                f"{device}_memory_usage={self.device_memory_usage}>")


class EventList(list):
    """A list of :class:`FunctionEvent` (or :class:`FunctionEventAvg`) with the analyses
    of PyTorch's: ``table``, ``key_averages``, ``total_average``, ``export_chrome_trace``,
    ``export_stacks``."""

    def __init__(self, *args, use_device=None, profile_memory=False, with_flops=False):
        super().__init__(*args)
        self._use_device = use_device
        self._profile_memory = profile_memory
        self._with_flops = with_flops
        self._tree_built = False

    def _build_tree(self):
        self._populate_cpu_children()
        self._remove_dup_nodes()
        self._set_backward_stacktraces()
        self._tree_built = True

    def __str__(self):
        return self.table()

    def _populate_cpu_children(self):
        """Parents and children by interval, per (thread, node): an event is the child of
        the innermost event whose interval contains its own. Async events are left out."""
        events = sorted((e for e in self if not e.is_async and e.device_type == DeviceType.CPU),
                        key=attrgetter("node_id", "thread"))
        for _, group in itertools.groupby(events, key=attrgetter("node_id", "thread")):
            open_events = []
            for event in sorted(group, key=lambda e: (e.time_range.start, -e.time_range.end)):
                while open_events:
                    parent = open_events[-1]
                    if event.time_range.start >= parent.time_range.end or \
                            event.time_range.end > parent.time_range.end:
                        open_events.pop()
                        continue
                    parent.append_cpu_child(event)
                    event.set_cpu_parent(parent)
                    break
                open_events.append(event)

    def _remove_dup_nodes(self):
        """An event whose only child has its name (a wrapper of itself) gives way to it."""
        while True:
            gone = set()
            for i, event in enumerate(self):
                parent = event.cpu_parent
                if parent is not None and parent.name == event.name and \
                        len(parent.cpu_children) == 1:
                    parent.cpu_children = event.cpu_children
                    parent.kernels = event.kernels
                    for child in event.cpu_children:
                        child.cpu_parent = parent
                    gone.add(i)
            if not gone:
                return
            kept = [e for i, e in enumerate(self) if i not in gone]
            self.clear()
            self.extend(kept)

    def _set_backward_stacktraces(self):
        """A backward event gets the stack of the forward op that made its node."""
        def backward_parent(event):
            while event is not None and event.scope != BACKWARD_FUNCTION:
                event = event.cpu_parent
            return event

        forward = {}
        for event in self:
            if backward_parent(event) is None and event.stack:
                forward.setdefault((event.sequence_nr, event.thread), event.stack)
        for event in self:
            parent = backward_parent(event)
            if parent is not None:
                event.stack = forward.get((parent.sequence_nr, parent.fwd_thread), [])

    @property
    def self_cpu_time_total(self):
        return sum(event.self_cpu_time_total for event in self)

    def table(self, sort_by=None, row_limit=100, max_src_column_width=75,
              max_name_column_width=55, max_shapes_column_width=80, header=None,
              top_level_events_only=False, time_unit=None):
        """The events as PyTorch's table. ``sort_by`` names an attribute (``cpu_time_total``,
        ``self_cpu_time_total``, ``cpu_memory_usage``, ``count``...), largest first."""
        return build_table(self, sort_by=sort_by, row_limit=row_limit,
                           max_src_column_width=max_src_column_width,
                           max_name_column_width=max_name_column_width,
                           max_shapes_column_width=max_shapes_column_width, header=header,
                           profile_memory=self._profile_memory, with_flops=self._with_flops,
                           top_level_events_only=top_level_events_only, time_unit=time_unit)

    def export_chrome_trace(self, path):
        """These events as a Chrome trace (the legacy profiler's format: one ``X`` event
        each, remote ones on a thread named after their node)."""
        records = []
        for event in self:
            if event.trace_name is None:
                continue
            tid = event.thread if not event.is_remote else \
                f" node_id:{event.node_id}, thread_id:{event.thread} "
            records.append({"name": event.trace_name, "ph": "X", "ts": event.time_range.start,
                            "dur": event.time_range.elapsed_us(), "tid": tid,
                            "pid": "CPU functions", "args": {}})
        with open(path, "w") as f:
            json.dump(records, f)

    def supported_export_stacks_metrics(self):
        return ["self_cpu_time_total", "self_cuda_time_total", "self_xpu_time_total",
                "self_privateuse1_time_total"]

    def export_stacks(self, path, metric):
        """Write ``stack;frames value`` lines (flame-graph input) for events with a stack."""
        if metric not in self.supported_export_stacks_metrics():
            raise ValueError("metric should be one of: "
                             + str(self.supported_export_stacks_metrics()))
        attr = metric.replace("cuda", "device").replace("xpu", "device") \
            .replace("privateuse1", "device")
        blanks = str.maketrans(" ;\t\n", "____")
        with open(path, "w") as f:
            for event in self:
                value = int(getattr(event, attr))
                if event.stack and value > 0:
                    frames = ";".join(entry.translate(blanks) for entry in reversed(event.stack))
                    f.write(f"{frames} {value}\n")

    def key_averages(self, group_by_input_shapes=False, group_by_stack_n=0,
                     group_by_overload_name=False):
        """One :class:`FunctionEventAvg` per key: name, node, device, legacy and annotation
        flags, and, when asked, input shapes, the first ``group_by_stack_n`` stack entries
        and the overload name."""
        if not self._tree_built:
            self._build_tree()
        stats = defaultdict(FunctionEventAvg)
        for event in self:
            key = [str(event.key), str(event.node_id), str(event.device_type),
                   str(event.is_legacy), str(event.is_user_annotation)]
            if group_by_overload_name:
                key.append(event.overload_name)
            if group_by_input_shapes:
                key.append(str(event.input_shapes))
            if group_by_stack_n > 0:
                key += event.stack[:group_by_stack_n]
            stats[tuple(key)].add(event)
        out = EventList(stats.values(), use_device=self._use_device,
                        profile_memory=self._profile_memory, with_flops=self._with_flops)
        for avg in out:
            avg.stack = avg.stack[:group_by_stack_n]
            if not group_by_input_shapes:
                avg.input_shapes = ""
            if not group_by_overload_name:
                avg.overload_name = ""
        return out

    def total_average(self):
        """All events summed into one :class:`FunctionEventAvg` keyed ``"Total"``."""
        total = FunctionEventAvg()
        for event in self:
            total.add(event)
            total.key = None
        total.key = "Total"
        return total
