"""What a person sees of a launch: merged logs, one progress bar, a loss curve.

Every process's output goes, whole, to its own log file in the run directory and,
line by line with a ``rank:name |`` prefix, to the console (``--show 0,2`` keeps
only those ranks). The progress bar (tqdm, when installed and the console is a
terminal) follows the coordinator's ``metrics.jsonl``: step, loss, samples/s.
Without a terminal, a plain progress line stands in for it every tenth of the run.
"""
import json
import os
import sys

__all__ = ["Console", "MetricsTail", "plot_loss"]


class MetricsTail:
    """New records of a JSON-lines file, read incrementally (complete lines only).

    ``restarted`` turns true when the file was replaced (a resumed run rewrites it):
    the records read so far are then stale.
    """

    def __init__(self, path):
        self.path, self._offset, self._partial, self._inode = path, 0, b"", None
        self.restarted = False

    def read(self):
        self.restarted = False
        try:
            with open(self.path, "rb") as fh:
                inode = os.fstat(fh.fileno()).st_ino
                if inode != self._inode:
                    self.restarted = self._inode is not None
                    self._inode, self._offset, self._partial = inode, 0, b""
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


class Console:
    """The launcher's console: prefixed child output, its own notes, the progress bar."""

    def __init__(self, show=None, progress=True, stream=None):
        self.show = show              # None: every rank
        self.out = stream or sys.stdout
        self.bar = None
        self.total = None
        self._want_bar = progress
        self._plain_every = None
        self._last = {}

    def _write(self, text):
        if self.bar is not None:
            self.bar.write(text, file=self.out)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def line(self, rank, name, text):
        if self.show is None or rank in self.show:
            self._write(f"{rank}:{name} | {text}")

    def note(self, text):
        self._write(f"launch | {text}")

    def metrics(self, records):
        for rec in records:
            if rec.get("event") == "start":
                self._start(rec["step"], rec["total_steps"])
            elif "loss" in rec and self.total:
                self._advance(rec)

    def _start(self, step, total):
        self.close()
        self.total = total
        if self._want_bar and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                tqdm.monitor_interval = 0  # no monitor thread in the supervisor
                self.bar = tqdm(total=total, initial=step, unit="step", dynamic_ncols=True,
                                leave=True)
                return
        self._plain_every = max(1, total // 10)

    def _advance(self, rec):
        step = rec["step"]
        self._last = rec
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(loss=f"{rec['loss']:.4f}",
                                 samples_s=f"{rec.get('samples_per_s', 0):.0f}", refresh=False)
        elif self._want_bar and self._plain_every and step % self._plain_every == 0:
            self.note(f"progress {step}/{self.total}  loss {rec['loss']:.4f}  "
                      f"{rec.get('samples_per_s', 0):.0f} samples/s")

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def plot_loss(run_dir, records):
    """Write ``loss.png`` (training and evaluation loss per step, and under it what the
    hooks logged: a panel per key, a line per stage); the path, or a note."""
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    held = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None, "no loss recorded: no loss curve"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, ("no loss curve: matplotlib is not installed "
                      "(pip install 'distgrad[launch]')")
    hooked = hook_series(records)
    fig, axes = plt.subplots(1 + len(hooked), 1, figsize=(7, 4 + 2.5 * len(hooked)),
                             squeeze=False, sharex=True)
    ax = axes[0][0]
    ax.plot(*zip(*train), label="training loss (batch)", linewidth=0.8)
    if held:
        ax.plot(*zip(*held), "o-", label="held-out loss")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title(os.path.basename(os.path.abspath(run_dir)))
    for (name, stages), (panel,) in zip(hooked.items(), axes[1:]):
        for stage, points in sorted(stages.items()):
            panel.plot(*zip(*points), label=stage, linewidth=0.8)
        panel.set_ylabel(name)
        panel.legend()
    axes[-1][0].set_xlabel("step")
    path = os.path.join(run_dir, "loss.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path, None


def hook_series(records):
    """``{key: {"stage<N>": [(step, value), ...]}}`` of the ``<key>.stage<N>`` values the
    hooks logged."""
    out = {}
    for r in records:
        if "loss" not in r:
            continue
        for key, value in r.items():
            name, dot, stage = key.rpartition(".")
            if dot and stage.startswith("stage") and isinstance(value, (int, float)):
                out.setdefault(name, {}).setdefault(stage, []).append((r["step"], value))
    return out
