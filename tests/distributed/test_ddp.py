"""DistributedDataParallel on two spawned ranks (of the session's world, see conftest.py):
training equals one process on the whole batch and PyTorch's DDP over gloo; buckets of
every size, gradients as bucket views, ``no_sync`` accumulation, unused parameters, models
that differ between ranks, buffers."""
import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def world(pg_world):
    """Ranks 0 and 1 of the session's world, in their group of two."""
    class Pair:
        def run(self, case, *args, timeout=None):
            return pg_world.run(case, *args, ranks=[0, 1], timeout=timeout)
    return Pair()


@pytest.mark.parametrize("config", [
    {},                                         # default buckets (one here)
    {"bucket_cap_mb": 0.0001},                  # a bucket per parameter or two
    {"bucket_cap_mb": 0.0001, "view": True},    # .grad lives in the buckets
    {"view": True, "set_to_none": False},       # zero_grad keeps the views
    {"micro": 3},                               # two no_sync micro-batches, then a sync
    {"micro": 2, "view": True, "bucket_cap_mb": 0.01},
    {"in_place": 256},                          # weights reduced in their own .grad
    {"in_place": 256, "micro": 3, "set_to_none": False},
    {"in_place": 256, "strided": True},         # rank 1's .grad of one is not contiguous
], ids=["default", "small-buckets", "small-views", "views-zeroed", "no_sync", "no_sync-views",
        "in-place", "in-place-no_sync", "in-place-strided"])
def test_ddp_equals_one_process_on_the_whole_batch(world, config):
    (err0, sum0, nb0), (err1, sum1, nb1) = world.run("train", config)
    assert sum0 == sum1 and nb0 == nb1  # both ranks hold the same bits
    if config.get("bucket_cap_mb") == 0.0001:
        assert nb0 >= 4


def test_ddp_equals_torch_ddp_over_gloo(world):
    pytest.importorskip("torch")
    world.run("against_torch", timeout=60)


@pytest.mark.parametrize("in_place", [None, 64], ids=["buckets", "in-place"])
def test_unused_parameters_are_found_and_averaged(world, in_place):
    r0, r1 = world.run("unused_parameters", in_place)
    assert r0 == r1


def test_gradients_sharing_memory_are_averaged_as_the_buckets_do(world):
    r0, r1 = world.run("shared_grad_memory")
    assert r0 == r1


def test_unused_parameters_without_detection_are_an_error_at_the_next_forward(world):
    world.run("unused_without_detection")


def test_models_that_differ_between_ranks_are_an_error_on_every_rank(world):
    for msg in world.run("model_mismatch"):
        assert "DDP expects same model across all ranks" in msg
        assert "'0.weight' of shape [16, 6]" in msg or "'0.weight' of shape [17, 6]" in msg


def test_buffers_come_from_rank_0(world):
    assert world.run("buffers") == [[1.0] * 3, [1.0] * 3]
