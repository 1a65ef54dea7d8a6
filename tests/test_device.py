"""Device objects, Tensor.to/cpu/cuda, factory device= keywords and the accelerator stubs,
checked against PyTorch where it is installed."""
import warnings

import pytest

import distgrad

pytestmark = pytest.mark.timeout(60)

DEVICE_ARGS = [("cpu",), ("cpu", 0), ("cpu:0",), ("cpu:12",), ("cuda",), ("cuda:1",),
               ("cuda", 2), ("mps",), ("meta",)]
BAD_DEVICE_ARGS = [("foo",), ("CPU",), ("",), ("cpu:-1",), ("cpu:x",), ("cpu:01",),
                   ("cpu", -1), ("cuda:1", 0), (None,), ("cpu", 1.5), ("cpu", True), (0,)]


@pytest.mark.parametrize("args", DEVICE_ARGS)
def test_device_parsing_printing_equality_as_torch(args):
    torch = pytest.importorskip("torch")
    d, t = distgrad.device(*args), torch.device(*args)
    assert (repr(d), str(d), d.type, d.index) == (repr(t), str(t), t.type, t.index)
    assert d == distgrad.device(*args) and hash(d) == hash(distgrad.device(*args))
    assert distgrad.device(d) == d


@pytest.mark.parametrize("args", BAD_DEVICE_ARGS)
def test_bad_devices_raise_torch_errors(args):
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception) as expected:
        torch.device(*args)
    with pytest.raises(expected.type) as got:
        distgrad.device(*args)
    if expected.type is RuntimeError:
        assert str(got.value) == str(expected.value)


def test_device_equality_rules():
    cpu = distgrad.device("cpu")
    assert cpu != distgrad.device("cpu", 0) and cpu != "cpu"
    assert distgrad.device("cpu", 0) == distgrad.device("cpu:0")
    assert len({cpu, distgrad.device("cpu"), distgrad.device("cpu:0")}) == 2
    import copy
    import pickle
    assert pickle.loads(pickle.dumps(cpu)) == cpu and copy.deepcopy(cpu) == cpu


def test_tensor_device_and_to_forms():
    x = distgrad.ones(2, 3)
    assert x.device == distgrad.device("cpu") and repr(x.device) == "device(type='cpu')"
    assert x.to("cpu") is x and x.to(distgrad.device("cpu", 0)) is x and x.cpu() is x
    assert x.to("cpu", distgrad.float64).dtype is distgrad.float64
    assert x.to(device="cpu", dtype=distgrad.int64).dtype is distgrad.int64
    assert x.to(distgrad.zeros(1, dtype=distgrad.float64)).dtype is distgrad.float64
    assert x.to(distgrad.float32, copy=True) is not x
    y = x.to("cpu", distgrad.float32, False, True)  # non_blocking, copy positionally
    assert y is not x and y.dtype is distgrad.float32
    with pytest.raises(TypeError, match="to()"):
        x.to("cpu", distgrad.float32, False, True, 3)


@pytest.mark.parametrize("call", [
    lambda x: x.to("cuda"), lambda x: x.to(distgrad.device("cuda", 0)),
    lambda x: x.to(device="mps"), lambda x: x.to("cuda:0", distgrad.float64), lambda x: x.cuda(),
    lambda x: distgrad.zeros(2, device="cuda"), lambda x: distgrad.tensor([1.0], device="cuda"),
    lambda x: distgrad.randn(2, device=distgrad.device("cuda")),
    lambda x: distgrad.arange(3, device="cuda"), lambda x: distgrad.zeros_like(x, device="mps"),
    lambda x: distgrad.Generator(device="cuda"),
])
def test_other_devices_raise_clear_runtime_error(call):
    with pytest.raises(RuntimeError, match="distgrad runs on the CPU only"):
        call(distgrad.ones(2))


def test_factories_accept_cpu_device():
    for device in ("cpu", "cpu:0", distgrad.device("cpu"), None):
        assert distgrad.zeros(2, device=device).device.type == "cpu"
        assert distgrad.full((2,), 1.0, device=device).shape == (2,)
        assert distgrad.randn_like(distgrad.ones(2), device=device).shape == (2,)
    with distgrad.device("cpu"):
        assert distgrad.ones(1).device.type == "cpu"
    with pytest.raises(RuntimeError, match="CPU only"):
        with distgrad.device("cuda"):
            pass


def test_cuda_backends_accelerator_match_a_cpu_only_torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("the oracle has an accelerator")
    assert distgrad.cuda.is_available() is torch.cuda.is_available() is False
    assert distgrad.cuda.device_count() == torch.cuda.device_count() == 0
    assert distgrad.cuda.manual_seed(0) is None and distgrad.cuda.manual_seed_all(0) is None
    assert distgrad.cuda.is_initialized() is False and distgrad.cuda.memory_allocated() == 0
    for name in ("enabled", "benchmark", "deterministic", "allow_tf32"):
        assert getattr(distgrad.backends.cudnn, name) == getattr(torch.backends.cudnn, name)
    assert distgrad.backends.cudnn.is_available() is torch.backends.cudnn.is_available()
    assert distgrad.backends.cuda.matmul.allow_tf32 == torch.backends.cuda.matmul.allow_tf32
    assert distgrad.backends.mps.is_available() is torch.backends.mps.is_available() is False
    assert distgrad.accelerator.is_available() is torch.accelerator.is_available() is False
    assert distgrad.accelerator.current_accelerator() is None
    assert torch.accelerator.current_accelerator() is None


def test_backend_flags_are_settable():
    cudnn = distgrad.backends.cudnn
    old = cudnn.deterministic, cudnn.benchmark
    try:
        cudnn.deterministic, cudnn.benchmark = True, True
        assert distgrad.backends.cudnn.deterministic and distgrad.backends.cudnn.benchmark
    finally:
        cudnn.deterministic, cudnn.benchmark = old


def test_cuda_calls_that_need_a_gpu_raise():
    for call in (distgrad.cuda.current_device, distgrad.cuda.synchronize,
                 lambda: distgrad.cuda.set_device(0), distgrad.cuda.get_device_name):
        with pytest.raises(RuntimeError, match="CPU only"):
            call()


def test_compile_returns_the_model_with_one_note(monkeypatch):
    from distgrad import compiler
    monkeypatch.setattr(compiler, "_noted", False)
    model = distgrad.nn.Linear(2, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert distgrad.compile(model) is model
        assert distgrad.compile(model, mode="max-autotune", fullgraph=True) is model
        fn = distgrad.compile(backend="eager")(len)
    assert fn is len
    assert [str(w.message) for w in caught] == [
        "distgrad.compile returns the model unchanged: distgrad has no compiler, the model runs "
        "eagerly"]
    with pytest.raises(TypeError):
        distgrad.compile(model, no_such_option=1)


def test_onnx_export_is_not_supported():
    import distgrad.onnx
    assert distgrad.onnx.is_in_onnx_export() is False
    with pytest.raises(RuntimeError, match="not supported"):
        distgrad.onnx.export(distgrad.nn.Linear(2, 1), (distgrad.ones(1, 2),), "model.onnx")
