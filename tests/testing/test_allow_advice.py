"""A module a test world refuses is explained in pytest's terms: the ini key
``distgrad_allowed_modules`` and ``allowed_modules=`` of the fixture or the marker,
never init_rpc's options or ``distgrad worker --allow``, which a pytest user does not
write; and doing what it says works."""
import pytest

from distgrad.rpc.allowlist import Allowlist
from distgrad.testing.pytest_plugin import ALLOW_ADVICE

pytestmark = pytest.mark.timeout(120)

# json: a module no rank allows unless told (the standard library never is by default)
EXAMPLE = '''
import json

import pytest
from distgrad.distributed import rpc


def test_called_on_a_worker(rpc_world):
    rpc_world(1)
    assert rpc.rpc_sync("worker1", json.dumps, ([1],)) == "[1]"


@pytest.mark.world(2)
def test_called_on_rank_0(rank, world_size):
    if rank == 1:
        assert rpc.rpc_sync("worker0", json.dumps, ([1],)) == "[1]"
'''


def test_a_refusal_names_what_a_pytest_user_sets(example):
    result = example(EXAMPLE)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    advice = ALLOW_ADVICE.replace("{module}", "json")
    assert out.count(f"Allow it on every worker of the world: {advice}") >= 2   # worker1, rank 0
    assert "init_rpc" not in out and "--allow" not in out, out


def test_doing_what_it_says_works(example):
    example(EXAMPLE, ini="distgrad_allowed_modules = json\n").assert_outcomes(passed=2)


def test_outside_a_test_world_the_advice_is_init_rpcs():
    message = Allowlist(["mylib"])._refusal("json:dumps", "json")
    assert "RpcBackendOptions(allowed_modules=['json']) in init_rpc, or `distgrad worker " \
           "--allow json`" in message
