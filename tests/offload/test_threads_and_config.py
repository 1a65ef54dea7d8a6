"""Concurrent threads each under their own hooks; tiers' eviction order; policies and
hook objects from TOML, with errors naming the key and the file."""
import contextlib
import threading

import numpy as np
import pytest

from distgrad.offload import OffloadPolicy, hooks_from_config, save_on_disk, save_tiered
from distgrad.offload.disk import DiskTier
from distgrad.offload.policy import load_toml_table
from distgrad.offload.tiered import MemoryTier

from offload_helpers import assert_bitwise_equal, make_mlp

pytestmark = pytest.mark.timeout(60)


def test_threads_each_under_their_own_hooks(tmp_path):
    import distgrad
    # models and inputs first: the global generator is not for concurrent seeding
    models = {seed: make_mlp(seed=seed) for seed in range(4)}
    inputs = {seed: distgrad.randn(8, 32) for seed in range(4)}

    def grads(seed, hooks):
        model = models[seed]
        with hooks if hooks is not None else contextlib.nullcontext():
            loss = model(inputs[seed]).pow(2).mean()
        loss.backward()
        out = [p.grad.numpy().copy() for p in model.parameters()]
        model.zero_grad()
        return out
    want = {seed: grads(seed, None) for seed in range(4)}
    got, errors = {}, []

    def work(seed):
        try:
            hooks = (save_on_disk(tmp_path, min_bytes=0) if seed % 2 else
                     save_tiered(1000, directory=tmp_path, min_bytes=0))
            for _ in range(3):
                got[seed] = grads(seed, hooks)
            hooks.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for seed in range(4):
        assert_bitwise_equal(got[seed], want[seed])


def test_memory_tier_evicts_what_backward_needs_last(tmp_path):
    tier = MemoryTier(2500, then=DiskTier(tmp_path))
    for k in range(5):
        tier.put(k, np.full(1000, k, np.uint8))
    assert tier.in_memory() == [3, 4]
    tier.flush()
    assert len(tier.then.files()) == 3
    for k in range(5):
        assert tier.get(k)[0] == k
    tier.delete(0)
    assert len(tier.then.files()) == 2
    tier.close()


def test_policy_from_toml_and_errors_naming_key_and_file(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(f'[offload]\nkind = "tiered"\nmemory_bytes = 4096\n'
                    f'directory = "{tmp_path}"\n'
                    '[offload.policy]\nmin_bytes = 10\nexclude_modules = ["head"]\n')
    table = load_toml_table(good, "offload")
    hooks = hooks_from_config(table, str(good))
    assert type(hooks).__name__ == "save_tiered"
    assert hooks.policy == OffloadPolicy(min_bytes=10, exclude_modules=["head"])
    hooks.close()
    assert hooks_from_config({"kind": "none"}) is None

    bad = [({"kind": "disk", "polcy": {}}, "unknown key 'polcy'"),
           ({"kind": "disk", "policy": {"min_byte": 1}}, r"\[policy\]: unknown key 'min_byte'"),
           ({"kind": "disk", "policy": {"min_bytes": -1}}, "min_bytes must be an integer >= 0"),
           ({"kind": "disk", "policy": {"every_nth_layer": 0}}, "every_nth_layer"),
           ({"kind": "floppy"}, "key 'kind' must be one of"),
           ({"kind": "disk", "read": "slurp"}, "key 'read'"),
           ({"kind": "disk", "prefetch_bytes": "lots"}, "key 'prefetch_bytes'"),
           ({"kind": "remote"}, "needs key 'store'"),
           ({"kind": "tiered"}, "needs key 'memory_bytes'"),
           ({"kind": "disk", "memory_bytes": 5}, "unknown key 'memory_bytes' for kind 'disk'")]
    for table, message in bad:
        with pytest.raises(ValueError, match=message) as info:
            hooks_from_config(table, "configs/x.toml [offload]")
        assert "configs/x.toml" in str(info.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("[offload\n")
    with pytest.raises(ValueError, match="broken.toml: not valid TOML"):
        load_toml_table(broken)
    with pytest.raises(ValueError, match=r"good.toml: no table \[nothing\]"):
        load_toml_table(good, "nothing")


def test_policy_arguments_are_checked(tmp_path):
    with pytest.raises(TypeError, match="exclude_modules must be a list"):
        OffloadPolicy(exclude_modules=[3])
    with pytest.raises(ValueError, match="every_nth_layer without 'layers'.*model="):
        save_on_disk(tmp_path, policy=OffloadPolicy(every_nth_layer=2))
    with pytest.raises(ValueError, match="not both"):
        save_on_disk(tmp_path, policy=OffloadPolicy(), min_bytes=3)
    assert list(tmp_path.iterdir()) == []     # the refused objects' tiers are closed


def test_nested_hooks_the_innermost_wins(tmp_path):
    import distgrad
    outer, inner = save_on_disk(tmp_path, min_bytes=0), save_on_disk(tmp_path, min_bytes=0)
    x = distgrad.randn(8, 8, requires_grad=True)
    with outer:
        a = (x * 2).exp()
        with inner:
            b = a.tanh()
            with outer:                  # the same object, entered again inside
                c = b.sin()
        d = c.exp().sum()
    assert (outer.stats.tensors_offloaded, inner.stats.tensors_offloaded) == (3, 1)
    d.backward()
    want = ((x * 2).exp().tanh().sin().exp().sum())
    (g,) = distgrad.autograd.grad(want, x)
    assert np.array_equal(x.grad.numpy(), g.numpy())
    outer.close()
    inner.close()


def test_bytes_in_flight_are_bounded():
    from distgrad.offload.tier import Tier

    class Stuck(Tier):          # stores only when told to
        def __init__(self):
            super().__init__(max_inflight_bytes=2000)
            self.started = []

        def _start_put(self, key, payload):
            self.started.append(key)
    tier = Stuck()
    tier.put(1, np.zeros(1500, np.uint8))
    waited = []
    t = threading.Thread(target=lambda: waited.append(tier.put(2, np.zeros(1000, np.uint8))))
    t.start()
    t.join(0.2)
    assert t.is_alive() and tier.started == [1]   # 2500 bytes would be in flight: it waits
    tier._stored(1)
    t.join(5)
    assert tier.started == [1, 2] and waited[0] > 0.1
    assert tier.get(2).nbytes == 1000             # still here until stored
    tier._stored(2, RuntimeError("the disk is on fire"))
    with pytest.raises(RuntimeError, match="on fire"):
        tier.get(2)


def test_an_observer_sees_each_write_and_each_read_that_costs_io(tmp_path):
    events = []
    tier = MemoryTier(1000, DiskTier(str(tmp_path)))  # observing reaches the disk tier
    tier.observe(lambda kind, n, start, end: events.append((kind, n, start <= end)))
    try:
        tier.put(1, np.zeros(800, dtype=np.uint8))    # kept in memory: no I/O
        tier.put(2, np.zeros(4000, dtype=np.uint8))   # over the budget: written to disk
        tier.flush()
        assert events == [("write", 4000, True)]
        tier.get(1)                                   # from memory: no read
        assert tier.get(2).nbytes == 4000             # from disk: a read
        assert events == [("write", 4000, True), ("read", 4000, True)]
        tier.observe(None)
        tier.get(2)
        assert len(events) == 2
    finally:
        tier.close()


def _offload_threads():
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith(("distgrad-offload", "distgrad-store")))


def test_closing_the_hooks_joins_every_thread_they_started(tmp_path):
    import distgrad
    before = _offload_threads()
    model = make_mlp(seed=3)
    hooks = save_on_disk(tmp_path, min_bytes=0)
    with hooks:
        loss = model(distgrad.randn(8, 32)).pow(2).mean()
    loss.backward()   # reads ahead on a thread of its own
    del loss          # what backward saved dies: its records are released
    assert set(_offload_threads()) - set(before)   # the writer, at least
    hooks.close()
    assert _offload_threads() == before
