"""What peers may call: references resolve only to functions and classes defined in an
allowed module or to distgrad's entry points, never through an attribute chain."""
import operator
import os
import types

import numpy as np
import pytest

import distgrad
from distgrad.rpc.allowlist import Allowlist, default_entry_points, ref_of
from distgrad.rpc.errors import RefusedCallError
from support import rpc_funcs

pytestmark = pytest.mark.timeout(60)

USER = Allowlist(["support"])


def test_refs_resolve_to_the_same_object():
    for f in (rpc_funcs.echo, rpc_funcs.Counter, rpc_funcs.Counter.increment, operator.add,
              distgrad.add, distgrad.nn.Linear, distgrad.optim.SGD, distgrad.nn.functional.relu):
        assert USER.resolve(ref_of(f)) is f
    assert USER.resolve("distgrad:add") is distgrad.add  # a public alias of an entry point


@pytest.mark.parametrize("ref", [
    # the attacks of the hardening issue: walking out of an allowed module
    "distgrad.autograd.tensor:sys.modules.get", "support.rpc_funcs:os.system",
    "support.rpc_funcs:np.ndarray.tofile", "support.rpc_funcs:np.save",
    "distgrad.ops.creation:np.ndarray.tofile", "support.rpc_funcs:threading.Thread",
    "distgrad:save", "distgrad.serialization:save", "distgrad:load",
    "distgrad.testing.world:World", "distgrad.testing.pytest_plugin:rpc_world",
    "distgrad.worker:main", "distgrad.utils.tempdirs:sweep_stale",
    "distgrad.rpc.agent:Agent", "distgrad.distributed.autograd.engine:threading",
    # plain refusals and malformed references
    "os:system", "os:environ.get", "builtins:eval", "subprocess:Popen", "operator:attrgetter",
    "operator:methodcaller", "support.rpc_funcs:echo.__globals__",
    "support.rpc_funcs:__builtins__", "support.rpc_funcs:nope", "not a ref", "distgrad.x-y:z",
    "distgradx.evil:f", "support:rpc_funcs", "distgrad:nn",
])
def test_refused_references(ref):
    with pytest.raises(RefusedCallError):
        USER.resolve(ref)


def test_a_name_imported_into_an_allowed_module_is_not_allowed_through_it():
    # support.rpc_funcs imports numpy's ndarray functions and os; its own functions pass
    assert USER.resolve("support.rpc_funcs:make_array") is rpc_funcs.make_array
    with pytest.raises(RefusedCallError, match="module"):
        USER.resolve("support.rpc_funcs:os")


def test_refused_error_tells_how_to_allow():
    with pytest.raises(RefusedCallError, match="allowed_modules=\\['json'\\].*--allow json"):
        USER.resolve("json:dumps")
    assert Allowlist(["json"]).resolve("json:dumps")


def test_default_entry_points_hold_no_file_process_or_test_functions():
    objs = default_entry_points().values()
    modules = {getattr(o, "__module__", "") for o in objs}
    denied = ("distgrad.serialization", "distgrad.testing", "distgrad.multiprocessing",
              "distgrad.utils.data", "distgrad.launch", "distgrad.offload", "distgrad.worker",
              "distgrad.rpc", "distgrad.distributed", "os", "subprocess", "builtins")
    assert not [m for m in modules if m.startswith(denied)]
    assert distgrad.save not in objs and distgrad.load not in objs
    assert distgrad.tensor in objs and distgrad.nn.Linear in objs and operator.add in objs


def test_rref_methods_only_of_allowed_classes():
    counter = rpc_funcs.Counter(3)
    assert USER.method(counter, "increment")(2) == 5
    assert Allowlist().method(distgrad.ones(2), "sum")().item() == 2.0
    for value, name in [(counter, "__reduce__"), (counter, "__class__"), ({}, "clear"),
                        (np.zeros(2), "tofile"), (counter, "nope"), (os, "system")]:
        with pytest.raises(RefusedCallError):
            USER.method(value, name)
    with pytest.raises(RefusedCallError, match="not allowed"):
        Allowlist().method(counter, "increment")  # support is not allowed there


@pytest.mark.parametrize("value", [os, os.system, print, rpc_funcs.Counter, len,
                                   types.SimpleNamespace().__init__, str.upper])
def test_rref_values_may_not_be_code(value):
    with pytest.raises(RefusedCallError, match="cannot be held"):
        Allowlist.check_value(value, "f")
    Allowlist.check_value(rpc_funcs.Counter(), "f")


def test_lambdas_and_local_functions_do_not_travel():
    def local():
        pass
    for f in (lambda: 0, local):
        with pytest.raises(TypeError, match="module-level"):
            ref_of(f)


def test_spawned_main_module_is_main_on_the_wire():
    f = types.FunctionType(rpc_funcs.echo.__code__, {}, "job")
    f.__module__, f.__qualname__ = "__mp_main__", "job"
    assert ref_of(f) == "__main__:job"


def test_the_shared_code_directories_are_found_once_for_all_threads(monkeypatch):
    # sysconfig fills its module-wide variables on first use; two handler threads finding
    # them at once made one fail ("dictionary changed size during iteration")
    import threading
    import time

    from distgrad.rpc import allowlist

    found = []

    def slow_find():
        found.append(threading.get_ident())
        time.sleep(0.05)  # long enough for every thread to ask meanwhile
        return ["/shared"]

    monkeypatch.setattr(allowlist, "_shared_dirs", None)
    monkeypatch.setattr(allowlist, "_find_shared_code_dirs", slow_find)
    start = threading.Barrier(8)
    answers = []

    def ask():
        start.wait()
        answers.append(allowlist._shared_code_dirs())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(found) == 1 and answers == [["/shared"]] * 8
