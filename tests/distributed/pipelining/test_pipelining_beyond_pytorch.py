"""What PyTorch's schedules cannot do, done here, each against one process training the
same model:

* an uneven last micro-batch (a batch that does not divide): PyTorch receives every
  micro-batch into buffers sized by the first and fails (gloo aborts the process);
* micro-batches whose shapes change from step to step: the same;
* zero-bubble schedules with data-parallel replicas: PyTorch's weight pass bypasses DDP's
  hooks, so the replicas' gradients are never averaged; here the stage averages them
  after its last backward of the step, whatever the schedule;
* a weight shared by two stages of one rank (tied in a V schedule) under zero-bubble:
  each stage's weight pass adds its own part once.
"""
import numpy as np
import pytest

pytest.importorskip("zmq")

from support import pipelining_cases as pc  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _grads(results, ranks=(0, 1)):
    out = {}
    for r in ranks:
        out.update(results[r]["grads"] if isinstance(results[r], dict) and "grads" in
                   results[r] else results[r])
    return out


def _same(grads, ref, atol=4e-5):
    assert sorted(grads) == sorted(ref)
    for k, g in grads.items():
        np.testing.assert_allclose(g, ref[k], rtol=1e-5, atol=atol, err_msg=k)


@pytest.mark.parametrize("name", ["1F1B", "InterleavedZeroBubble", "DualPipeV"])
@pytest.mark.parametrize("rows", [15, 17])
def test_an_uneven_last_micro_batch(pp_world, name, rows):
    results = pp_world.run("train", {"schedule": name, "rows": [rows]})
    n_stages = 2 if name in pc.SINGLE else 4
    ref = pc.reference(n_stages, 1, [pc.batch(rows)])
    _same(_grads(results), ref["grads"])
    last = [r for r in results[:2] if r["losses"]][0]
    np.testing.assert_allclose(last["out"], ref["out"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["GPipe", "ZBVZeroBubble"])
def test_micro_batches_whose_shapes_change_from_step_to_step(pp_world, name):
    rows = [16, 12, 20]
    results = pp_world.run("train", {"schedule": name, "rows": rows, "steps": 3})
    n_stages = 2 if name in pc.SINGLE else 4
    batches = [pc.batch(r, seed=1 + i) for i, r in enumerate(rows)]
    ref = pc.reference(n_stages, 3, batches)
    _same(_grads(results), ref["grads"])
    assert sum([r for r in results[:2] if r["losses"]][0]["losses"]) == \
        pytest.approx(ref["loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["InterleavedZeroBubble", "ZBVZeroBubble", "1F1B"])
def test_zero_bubble_with_data_parallel_replicas(pp_world, name):
    results = pp_world.run("replicated", {"schedule": name})
    n_stages = 2 if name in pc.SINGLE else 4
    ref = pc.reference(n_stages, 1, [pc.batch(16)], loss="mean")["grads"]
    for replica in (0, 1):  # both replicas hold the whole batch's mean gradient
        _same(_grads(results, (2 * replica, 2 * replica + 1)), ref, atol=1e-6)


@pytest.mark.parametrize("name", ["ZBVZeroBubble", "DualPipeV"])
def test_a_weight_shared_by_two_stages_of_a_rank(pp_world, name):
    results = pp_world.run("train", {"schedule": name, "tie": True})
    ref = pc.reference(4, 1, [pc.batch(16)], tie=True)["grads"]
    grads = _grads(results)
    # stage 3's first weight is stage 0's: both names hold the one, whole gradient
    np.testing.assert_array_equal(grads["0.0.weight"], grads["3.0.weight"])
    _same(grads, ref)
