import operator
import threading

import pytest

from distgrad.rpc.errors import RefusedCallError, RpcTimeoutError
from distgrad.rpc.futures import Future, collect_all
from distgrad.rpc.options import DEFAULT_ALLOWED_MODULES
from distgrad.rpc.resolve import ref_of, resolve
from distgrad.testing import rpc_funcs

ALLOWED = DEFAULT_ALLOWED_MODULES


def test_refs_resolve_to_the_same_object():
    for f in (rpc_funcs.echo, rpc_funcs.Counter, rpc_funcs.Counter.increment, operator.add):
        assert resolve(ref_of(f), ALLOWED) is f


@pytest.mark.parametrize("ref", [
    "os:system", "builtins:eval", "subprocess:Popen", "distgrad.testing.rpc_funcs:np.save",
    "distgrad.testing.rpc_funcs:echo.__globals__", "distgrad.testing.rpc_funcs:__builtins__",
    "distgrad.testing.rpc_funcs:nope", "not a ref", "distgrad.x-y:z", "distgradx.evil:f",
])
def test_refused_references(ref):
    with pytest.raises(RefusedCallError):
        resolve(ref, ALLOWED)


def test_refused_error_tells_how_to_allow():
    with pytest.raises(RefusedCallError, match="allowed_modules"):
        resolve("json:dumps", ALLOWED)
    assert resolve("json:dumps", ALLOWED + ("json",))


def test_lambdas_and_local_functions_do_not_travel():
    def local():
        pass
    for f in (lambda: 0, local):
        with pytest.raises(TypeError, match="module-level"):
            ref_of(f)


def test_future_then_chain_and_errors():
    f = Future()
    g = f.then(lambda fut: fut.value() * 2)
    assert not f.done()
    threading.Timer(0.01, f.set_result, (21,)).start()
    assert g.wait(5) == 42 and f.done() and f.value() == 21
    h = Future()
    k = h.then(lambda fut: fut.value())
    h.set_exception(KeyError("x"))
    with pytest.raises(KeyError):
        k.wait(1)
    with pytest.raises(RuntimeError):
        h.set_result(1)
    with pytest.raises(RpcTimeoutError):
        Future().wait(0.01)
    both = collect_all([f, Future()])
    assert not both.done()
