"""The profiler's table, with PyTorch's columns, widths and units.

``Name``, ``Self CPU %``, ``Self CPU``, ``CPU total %``, ``CPU total``, ``CPU time avg``,
then ``CPU Mem`` and ``Self CPU Mem`` when memory was profiled, ``# of Calls``, ``Node ID``
when an event ran on another node (an RPC callee), ``Input Shapes`` when shapes were
recorded, ``Source Location`` when events have stacks, ``Total <unit>FLOPs`` with
``with_flops``; the percentages are of the sum of self CPU times, which closes the table.
Device columns never appear: distgrad runs on the CPU.
"""
import math

__all__ = ["build_table", "format_time", "format_time_share", "format_memory"]

_COLUMN = 12   # width of every numeric column
_SPACING = 2   # blanks after every column
_FLOP_UNITS = ["FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs"]


def format_time(time_us):
    """``1.234ms``: seconds, milliseconds or microseconds, three decimals."""
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def format_time_share(time_us, total_us):
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def format_memory(nbytes):
    """``12.50 KB``: binary units, two decimals; bytes as an integer (``24 B``)."""
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def _in_unit(time_us, unit):
    if unit == "s":
        return f"{time_us / 1e6:.3f}s"
    if unit == "ms":
        return f"{time_us / 1e3:.3f}ms"
    if unit == "us":
        return f"{time_us:.3f}us"
    return format_time(time_us)


def _trim_path(path, width):
    if len(path) > width:
        path = path[len(path) - width:]
        if len(path) > 3:
            path = "..." + path[3:]
    return path


def _flop_scale(smallest):
    """(factor, header unit) that shows the smallest positive count in a readable unit."""
    power = max(0, min(int(math.log10(smallest) // 3), len(_FLOP_UNITS) - 1))
    return 10.0 ** (-3 * power), _FLOP_UNITS[power]


def build_table(events, sort_by=None, header=None, row_limit=100, max_src_column_width=75,
                max_name_column_width=55, max_shapes_column_width=80, with_flops=False,
                profile_memory=False, top_level_events_only=False, time_unit=None):
    """``events`` (FunctionEvent or FunctionEventAvg) as PyTorch's profiler table."""
    if len(events) == 0:
        return ""
    if sort_by is not None:
        attr = sort_by.replace("cuda", "device").replace("xpu", "device") \
            .replace("privateuse1", "device")
        events = sorted(events, key=lambda e: getattr(e, attr), reverse=True)
    has_shapes = any(e.input_shapes is not None and len(e.input_shapes) > 0 for e in events)
    has_overload = any(e.overload_name for e in events)
    stacks = [e.stack for e in events if e.stack]
    name_width = max(len(e.key) for e in events) + 4
    if max_name_column_width is not None:
        name_width = min(name_width, max_name_column_width)
    shapes_width = max(len(str(e.input_shapes)) for e in events) + 4
    if max_shapes_column_width is not None:
        shapes_width = min(shapes_width, max_shapes_column_width)
    src_width = None
    if stacks:
        src_width = max(len(entry) for stack in stacks for entry in stack) + 4
        if max_src_column_width is not None:
            src_width = min(src_width, max_src_column_width)

    headers = ["Name"] + (["Overload Name"] if has_overload else []) + [
        "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if profile_memory:
        headers += ["CPU Mem", "Self CPU Mem"]
    headers.append("# of Calls")
    with_node_id = any(e.node_id != -1 for e in events)
    if with_node_id:
        headers.append("Node ID")
    widths = [name_width] + [name_width] * has_overload + \
        [_COLUMN] * (len(headers) - 1 - has_overload)
    aligns = [">"] * len(headers)
    if has_shapes:
        headers.append("Input Shapes")
        widths.append(shapes_width)
        aligns.append(">")
    if stacks:
        headers.append("Source Location")
        widths.append(src_width)
        aligns.append("<")
    flops_scale = None
    if with_flops:
        counts = [e.flops for e in events if e.flops and e.flops > 0]
        if counts:
            flops_scale, unit = _flop_scale(min(counts))
            headers.append(f"Total {unit}")
            widths.append(_COLUMN)
            aligns.append(">")
    row_format = "".join("{: " + a + str(w) + "}" + " " * _SPACING
                         for a, w in zip(aligns, widths))
    separator = "".join("-" * w + " " * _SPACING for w in widths)
    line_length = sum(w + _SPACING for w in widths) - _SPACING

    total_self = sum(e.self_cpu_time_total for e in events)
    lines = []
    if header is not None:
        lines += ["=" * line_length, header]
    if top_level_events_only:
        lines += ["=" * line_length, "This report only display top-level ops statistics"]
    lines += [separator, row_format.format(*headers), separator]
    shown = 0
    for e in events:
        if shown == row_limit:
            break
        if top_level_events_only and e.cpu_parent is not None:
            continue
        shown += 1
        name = e.key
        if max_name_column_width is not None and len(name) >= max_name_column_width - 3:
            name = name[:max_name_column_width - 3] + "..."
        e.self_cpu_percent = format_time_share(e.self_cpu_time_total, total_self)
        e.total_cpu_percent = 0 if e.is_async else format_time_share(e.cpu_time_total,
                                                                     total_self)
        row = [name]
        if has_overload:
            row.append((e.overload_name or "")[:name_width])
        row += [e.self_cpu_percent, _in_unit(e.self_cpu_time_total, time_unit),
                e.total_cpu_percent, _in_unit(e.cpu_time_total, time_unit),
                _in_unit(e.cpu_time, time_unit)]
        if profile_memory:
            row += [format_memory(e.cpu_memory_usage), format_memory(e.self_cpu_memory_usage)]
        row.append(e.count)
        if with_node_id:
            row.append(e.node_id)
        if has_shapes:
            row.append(str(e.input_shapes)[:shapes_width])
        if stacks:
            row.append(_trim_path(e.stack[0], src_width) if e.stack else "")
        if flops_scale is not None:
            row.append("--" if not e.flops or e.flops <= 0 else f"{e.flops * flops_scale:8.3f}")
        lines.append(row_format.format(*row))
        if stacks:
            blank = [""] * (len(headers) - 1 - (flops_scale is not None))
            for entry in e.stack[1:]:
                tail = [""] if flops_scale is not None else []
                lines.append(row_format.format(*blank, _trim_path(entry, src_width), *tail))
            lines.append(row_format.format(*[""] * len(headers)))
    lines += [separator, f"Self CPU time total: {_in_unit(total_self, time_unit)}"]
    return "".join(line + "\n" for line in lines)
