"""Wrong use and failures get PyTorch's exception classes and say which stage, on which
rank, and what: a tensor that breaks its stage's contract (PyTorch's test_stage cases),
declared shapes that disagree between stages (both stages and both shapes), ranks that
disagree on the pipeline, and a stage whose module raises, which its neighbour hears of at
once instead of waiting for the group's timeout."""
import pytest

pytest.importorskip("zmq")

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("bad,words", [("int", "dtype mismatch"), ("float64", "dtype mismatch"),
                                       ("flatten", "shape mismatch")])
def test_a_tensor_that_breaks_the_first_micro_batch_contract(pp_world, bad, words):
    # a good step on both ranks, then rank 0 alone with a bad input (or output): it fails
    # before anything leaves it
    results = pp_world.run("train", {"schedule": "GPipe", "then_on_rank0": bad})
    kind, message = results[0]["then"]
    assert kind == "PipeliningShapeError" and words in message, message
    assert "Stage 0" in message


def test_declared_shapes_that_disagree_name_both_stages_and_both_shapes(pp_world):
    config = {"schedule": "1F1B", "declare": {"0": {"output_args": [4, 8]},
                                              "1": {"input_args": [4, 6]}}}
    results = pp_world.run("errors", config, ranks=[0, 1, 2, 3])
    for ok, kind, message in results[:2]:
        assert not ok and kind == "PipeliningShapeError", message
        assert "stage 0 (rank 0)" in message and "stage 1 (rank 1)" in message
        assert "(4, 8)" in message and "(4, 6)" in message


def test_an_output_that_breaks_the_next_stage_input_args(pp_world):
    # stage 1 declares micro-batches of 4 rows; stage 0 makes 8 (16 rows in 2)
    config = {"schedule": "GPipe", "chunks": 2, "declare": {"1": {"input_args": [4, 8]}}}
    (ok0, kind0, msg0), (ok1, kind1, msg1) = pp_world.run("errors", config)[:2]
    assert kind0 == "PipeliningShapeError" and kind1 == "StageShapeFailedError"  # a subclass
    assert "stage 0 output for stage 1 (its input_args)" in msg0 and "(4, 8)" in msg0 \
        and "(8, 8)" in msg0
    assert msg1.startswith("stage 0 (rank 0) failed") and "(8, 8)" in msg1


def test_ranks_that_disagree_on_the_pipeline_say_so(pp_world):
    config = {"schedule": "GPipe", "chunks_by_rank": {"1": 2}}
    for ok, kind, message in pp_world.run("errors", config)[:2]:
        assert kind == "RuntimeError" and "the ranks disagree on the pipeline" in message
        assert "n_microbatches=4" in message and "n_microbatches=2" in message


@pytest.mark.parametrize("name", ["1F1B", "InterleavedZeroBubble"])
def test_a_stage_that_raises_is_named_on_its_neighbour_at_once(pp_world, name):
    config = {"schedule": name, "boom": {"stage": 1, "at": 2}}
    results = pp_world.run("errors", config, timeout=30)  # far below the group's 60 s
    ok, kind, message = results[1]
    assert kind == "RuntimeError" and "[Stage 1] failed to run forward" in message
    ok, kind, message = results[0]
    assert kind == "StageFailedError" and "stage 1 (rank 1) failed" in message
    assert "ZeroDivisionError: boom at call 2" in message
