"""The activation store on another host: a store bound to every interface of its host
advertises an address the other hosts reach, and a training step there offloads to it."""
import subprocess
import sys

import pytest

from support import multihost

pytestmark = pytest.mark.timeout(90)


def test_a_step_offloads_its_activations_to_a_store_on_another_host(simulated_hosts):
    a, b = simulated_hosts(2, private_shm=True)
    store = a.popen([sys.executable, "-m", "distgrad", "store", "--bind", "tcp://0.0.0.0:0"],
                    stdout=subprocess.PIPE, text=True)
    try:
        line = store.stdout.readline()
        endpoint = line.split("serving at ", 1)[1].strip()
        assert endpoint.startswith(f"tcp://{a.address}:"), line
        got = b.spawn(multihost.offloaded_step, endpoint).result(60)
        assert got["equal"] and got["held"] > 0
    finally:
        store.terminate()
        store.wait(10)
        store.stdout.close()
