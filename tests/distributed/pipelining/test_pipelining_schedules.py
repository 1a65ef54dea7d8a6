"""Every schedule on real processes, against one process training the same model: the
gradients of every stage, the last stage's output and losses (PyTorch's
test_schedule_multiproc cases: several steps, manual stages, interleaved stages,
zero-bubble, V-shaped and CSV-given orders)."""
import numpy as np
import pytest

pytest.importorskip("zmq")

from support import pipelining_cases as pc  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ALL = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
       "ZBVZeroBubble", "DualPipeV"]


def _check(results, ref, ranks=(0, 1), rtol=1e-5, atol=4e-5):
    grads = {}
    for r in ranks:
        grads.update(results[r]["grads"])
    assert sorted(grads) == sorted(ref["grads"])
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref["grads"][name], rtol=rtol, atol=atol, err_msg=name)
    last = [results[r] for r in ranks if results[r]["losses"]]
    assert len(last) == 1
    np.testing.assert_allclose(last[0]["out"], ref["out"], rtol=1e-5, atol=1e-6)
    assert sum(last[0]["losses"]) == pytest.approx(ref["loss"], rel=1e-5)


@pytest.mark.parametrize("name", ALL)
def test_every_schedule_trains_like_one_process(pp_world, name):
    config = {"schedule": name, "steps": 2, "chunks": 4}
    results = pp_world.run("train", config)
    n_stages = 2 if name in pc.SINGLE else 4
    _check(results, pc.reference(n_stages, 2, [pc.batch(16)]))


@pytest.mark.parametrize("name", ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                  "ZBVZeroBubble", "DualPipeV", "1F1B"])
def test_four_ranks_eight_micro_batches(pp_world, name):
    ranks = [0, 1, 2, 3]
    results = pp_world.run("train", {"schedule": name, "ranks": ranks, "chunks": 8})
    n_stages = 4 if name in pc.SINGLE else 8
    _check(results, pc.reference(n_stages, 1, [pc.batch(16)]), ranks)


@pytest.mark.parametrize("name", ["GPipe", "1F1B"])
def test_twenty_steps_in_a_row(pp_world, name):
    results = pp_world.run("train", {"schedule": name, "steps": 20, "rows": [16, 16]})
    _check(results, pc.reference(2, 20, [pc.batch(16, seed=1), pc.batch(16, seed=2)]))


@pytest.mark.parametrize("name", ["GPipe", "InterleavedZeroBubble"])
def test_a_mean_loss_with_scale_grads_is_the_whole_batch_mean(pp_world, name):
    results = pp_world.run("train", {"schedule": name, "loss": "mean", "scale_grads": True})
    n_stages = 2 if name in pc.SINGLE else 4
    ref = pc.reference(n_stages, 1, [pc.batch(16)], loss="mean")
    grads = {**results[0]["grads"], **results[1]["grads"]}
    for k, g in grads.items():
        np.testing.assert_allclose(g, ref["grads"][k], rtol=1e-5, atol=1e-6)
    # each micro-batch's mean loss; their mean is the batch's
    assert np.mean(results[1]["losses"]) == pytest.approx(ref["loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["1F1B", "ZBVZeroBubble"])
def test_eval_runs_forwards_only(pp_world, name):
    results = pp_world.run("train", {"schedule": name, "eval": True})
    n_stages = 2 if name in pc.SINGLE else 4
    ref = pc.reference(n_stages, 1, [pc.batch(16)])
    assert results[0]["grads"] == {} and results[1]["grads"] == {}
    last = [r for r in results[:2] if r["losses"]][0]
    np.testing.assert_allclose(last["out"], ref["out"], rtol=1e-5, atol=1e-6)
    assert sum(last["losses"]) == pytest.approx(ref["loss"], rel=1e-5)


# orders given as actions (PyTorch's _PipelineScheduleRuntime with a CSV): a V over two
# ranks, and an unbalanced split (three stages on rank 0, one on rank 1)
V_ORDER = "0F0,0F1,3F0,3B0,3F1,3B1,0B0,0B1\n1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1"
UNBALANCED = "0F0,1F0,2F0,0F1,1F1,2F1,2B0,1B0,0B0,2B1,1B1,0B1\n3F0,3B0,3F1,3B1"


@pytest.mark.parametrize("order,stages", [(V_ORDER, [[0, 3], [1, 2]]),
                                          (UNBALANCED, [[0, 1, 2], [3]])],
                         ids=["v_shaped", "unbalanced"])
def test_orders_given_as_actions(pp_world, order, stages):
    config = {"schedule": "runtime", "actions": order, "stages": stages, "n_stages": 4,
              "chunks": 2, "steps": 2}
    results = pp_world.run("train", config)
    ref = pc.reference(4, 2, [pc.batch(16)])
    grads = {**results[0]["grads"], **results[1]["grads"]}
    for k, g in grads.items():
        np.testing.assert_allclose(g, ref["grads"][k], rtol=1e-5, atol=4e-5)
    assert sorted(grads) == sorted(ref["grads"])


def test_an_order_given_with_its_communication(pp_world):
    from distgrad import nn
    from distgrad.distributed.pipelining import PipelineStage
    from distgrad.distributed.pipelining.schedules import _PipelineScheduleRuntime

    class Ranks:
        rank, size = 0, 2
    local = _PipelineScheduleRuntime([PipelineStage(nn.Linear(1, 1), i, 4, _channel=Ranks())
                                      for i in (0, 3)], 2)
    local._load_actions(V_ORDER)  # lowered here: its sends and receives, as text
    comms = "\n".join(",".join(map(str, local.pipeline_order_with_comms[r])) for r in (0, 1))
    config = {"schedule": "runtime", "actions": comms, "format": "compute_comms",
              "stages": [[0, 3], [1, 2]], "n_stages": 4, "chunks": 2}
    results = pp_world.run("train", config)
    ref = pc.reference(4, 1, [pc.batch(16)])
    for k, g in {**results[0]["grads"], **results[1]["grads"]}.items():
        np.testing.assert_allclose(g, ref["grads"][k], rtol=1e-5, atol=4e-5)
