"""Running measured variants in lockstep: fresh processes, steps interleaved.

Each variant of an experiment runs in a process of its own (its memory is its
own), but their steps take turns: the parent tells each child in turn to run one
step and waits for its measurement, so a machine that gets busier slows every
variant alike instead of the one that happened to run then. Protocol on the
child's stdin/stdout, one line each: ``step`` -> a JSON measurement, ``done`` ->
the child's final JSON (its counters) and exit. The child's first line, once it
is set up and warmed up, is ``{"ready": true}``.
"""
import contextlib
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import time

from .memory import MEASURE_ENV, PeakMemory, MemoryTimeline, rss_bytes

__all__ = ["serve_steps", "serve_training", "Lockstep", "slowdown"]


def serve_training(model, inputs, hooks, timeline_interval=None, forward=None):
    """Serve steps of ``model(inputs).pow(2).mean().backward()``, forward under ``hooks``
    (an offloading hook object or None), gradients zeroed in place between steps; the
    final JSON is the hook object's counters per step (the warm-up included).
    ``forward(inputs)`` runs instead of ``model(inputs)`` when given (a checkpointed
    forward of the same model); ``model`` may be a PyTorch module too."""
    forward = forward or model

    def step(forward_done):
        with hooks if hooks is not None else contextlib.nullcontext():
            loss = forward(inputs).pow(2).mean()
        forward_done()
        loss.backward()

    def zero_grads():
        for p in model.parameters():
            p.grad.zero_()

    def final(steps):
        if hooks is None:
            return {"stats": None}
        hooks.flush()
        stats = {k: v / steps for k, v in hooks.stats.as_dict().items()}
        hooks.close()
        return {"stats": stats}
    serve_steps(step, zero_grads, final, timeline_interval)


def serve_steps(step, after_step, final=None, timeline_interval=None):
    """The child's side: warm up (``step()``; ``after_step()``), then serve the parent.
    ``final(steps_run)`` gives the JSON answered to ``done``. A ``step`` that takes an
    argument is given ``forward_done()`` to call between its forward and backward: the
    measurement then has the RSS held at that moment (``forward_bytes``, the activations
    kept for backward) and the forward's time (``forward_s``)."""
    marks = {}
    takes_mark = bool(inspect.signature(step).parameters)
    run = (lambda: step(lambda: marks.update(s=time.perf_counter(), rss=rss_bytes()))) \
        if takes_mark else step
    run()
    after_step()
    steps = 1
    _say({"ready": True})
    for line in sys.stdin:
        command = line.strip()
        if command == "step":
            marks.clear()
            pm = PeakMemory().start()
            sampler = MemoryTimeline(timeline_interval).start() if timeline_interval else None
            # wall time read outside the waits' reads: a preemption between the two is then
            # in the wall time, never in the waits alone (the step time is never understated)
            t0 = time.perf_counter()
            c0, r0 = time.process_time(), _ready_ns()
            run()
            r1, cpu = _ready_ns(), time.process_time() - c0
            seconds = time.perf_counter() - t0
            timeline = None
            if sampler is not None:
                timeline = [(t, rss - pm.baseline) for t, rss in sampler.stop()]
            measured = {"step_s": seconds, "cpu_s": cpu, "peak_bytes": pm.stop(),
                        "memory_method": pm.method, "timeline": timeline}
            if r0 is not None and r1 is not None:
                measured["ready_s"] = (r1 - r0) / 1e9
            if marks:
                measured.update(forward_s=marks["s"] - t0,
                                forward_bytes=max(0, marks["rss"] - pm.baseline))
            _say(measured)
            after_step()
            steps += 1
        elif command == "done":
            _say(final(steps) if final is not None else {})
            return


def _ready_ns():
    """Nanoseconds this thread has spent ready to run but waiting for a core (the kernel's
    scheduler statistics), or None where they are not kept. A step's wall time minus its
    thread's increase of this is its time on a machine with a core to spare for it: what
    other processes' load added is left out, what the step waited for (I/O) is not."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Lockstep:
    """The parent's side: ``variants`` maps a name to the argv of its child.

    Children start together and warm up; then each ``round()`` has every live child
    run one measured step in turn; ``summary()`` gives ``{name: {"step_s",
    "peak_bytes", "cpu_s" (the process's CPU time, all its threads; medians),
    "steps_s", "peaks", "timeline" (of the last step); "own_step_s" (median),
    "own_steps_s" and "ready_s" where the kernel keeps scheduler statistics (the step's
    time less what its thread waited for a core: other processes' load left out); and
    "forward_bytes", "forward_s" (medians) when the steps mark their forward's end}}``
    or ``{"error": ...}`` for a child that died; ``finish()`` collects each
    child's final JSON. A child silent for ``timeout`` seconds is killed and
    reported. Leaving a ``with`` block kills and reaps what is left.
    """

    def __init__(self, variants, env=None, timeout=1800.0):
        child_env = dict(os.environ, **MEASURE_ENV, **(env or {}))
        self.timeout = timeout
        self.children = {}
        self.errors = {}
        self.measured = {name: [] for name in variants}
        self._stderr = {}
        for name, argv in variants.items():
            # stderr to a file: a chatty child must not block on a full pipe
            self._stderr[name] = tempfile.TemporaryFile(mode="w+")
            self.children[name] = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr[name],
                text=True, env=child_env)
        for name in list(self.children):
            self._read(name)   # ready

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self, name):
        proc = self.children[name]
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        if not ready:
            proc.kill()
            self.errors[name] = f"no answer within {self.timeout:g} s"
            line = ""
        else:
            line = proc.stdout.readline()
        if not line:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            if name not in self.errors:
                self._stderr[name].seek(0)
                err = self._stderr[name].read().strip().splitlines()
                self.errors[name] = err[-1] if err else f"exited with {proc.returncode}"
            self._reap(name)
            return None
        return json.loads(line)

    def _tell(self, name, command):
        try:
            self.children[name].stdin.write(command + "\n")
            self.children[name].stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        return self._read(name)

    def round(self):
        """Every live child runs one measured step; returns this round's measurements."""
        out = {}
        for name in list(self.children):
            m = self._tell(name, "step")
            if m is not None:
                self.measured[name].append(m)
                out[name] = m
        return out

    def summary(self):
        results = {}
        for name, ms in self.measured.items():
            if name in self.errors:
                results[name] = {"error": self.errors[name]}
                continue
            times = [m["step_s"] for m in ms]
            peaks = [m["peak_bytes"] for m in ms]
            results[name] = {"step_s": _median(times), "peak_bytes": _median(peaks),
                             "cpu_s": _median([m.get("cpu_s", 0.0) for m in ms]),
                             "steps_s": times, "peaks": peaks,
                             "memory_method": ms[-1]["memory_method"] if ms else None,
                             "timeline": ms[-1]["timeline"] if ms else None}
            if ms and all("ready_s" in m for m in ms):
                own = [max(0.0, m["step_s"] - m["ready_s"]) for m in ms]
                results[name].update(own_step_s=_median(own), own_steps_s=own,
                                     ready_s=_median([m["ready_s"] for m in ms]))
            if ms and "forward_bytes" in ms[0]:
                results[name].update(
                    forward_bytes=_median([m["forward_bytes"] for m in ms]),
                    forward_s=_median([m["forward_s"] for m in ms]))
        return results

    def finish(self):
        """Each child's final JSON, by name; every child is reaped."""
        finals = {}
        for name in list(self.children):
            final = self._tell(name, "done")
            if final is not None:
                finals[name] = final
        self.close()
        return finals

    def _reap(self, name):
        proc = self.children.pop(name)
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout):
            stream.close()
        self._stderr.pop(name).close()

    def close(self):
        for name in list(self.children):
            self._reap(name)


def slowdown(result, base, key="steps_s"):
    """Median over rounds of ``result``'s step time over ``base``'s in the same round:
    steps of one round ran moments apart, so load that comes and goes cancels out.
    ``key``: which step times (``"own_steps_s"``: without the waits for a core)."""
    pairs = list(zip(result.get(key, ()), base.get(key, ())))
    return _median([r / b for r, b in pairs if b]) if pairs else None


def _median(values):
    values = sorted(values)
    n = len(values)
    if not n:
        return None
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
