"""Core lists (taskset's notation), their allocation to workers, and pinning."""
import os
import subprocess
import sys

import pytest

from distgrad.launch.environment import Layout, worker_cores
from distgrad.utils.cpus import allocate_cpus, allowed_cpus, format_cpus, parse_cpus, pin_to


def test_core_lists_read_and_write_as_taskset_does():
    assert parse_cpus("3,0-1") == [0, 1, 3]
    assert parse_cpus(" 2 ") == [2]
    assert format_cpus([4, 0, 1, 2]) == "0-2,4"
    for text in ("3-1", "a", "1,,2", "-1", ""):
        with pytest.raises(ValueError, match=repr(text)):
            parse_cpus(text)


def test_workers_get_neighbouring_cores_and_share_them_in_turn_when_too_many():
    assert allocate_cpus(2, 1, [0, 1]) == [[0], [1]]
    assert allocate_cpus(2, 2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert allocate_cpus(4, 1, [2, 5]) == [[2], [5], [2], [5]]
    assert allocate_cpus(1, 4, [0, 1]) == [[0, 1]]   # never a core twice in one set


def test_only_a_local_launch_pins_and_never_the_coordinator():
    local = Layout("local", 3, [0, 1, 2])
    cores = worker_cores(local, 1)
    assert sorted(cores) == [1, 2]
    assert all(set(c) <= set(allowed_cpus()) for c in cores.values())
    assert worker_cores(Layout("slurm", 3, [1]), 1) == {}


def test_pinning_to_a_core_this_process_may_not_use_names_it():
    with pytest.raises(ValueError, match=r"worker w cannot run on core\(s\) 4096: it may use"):
        pin_to([4096], "worker w")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_worker_refuses_cores_it_cannot_have_before_it_joins_anything():
    out = subprocess.run([sys.executable, "-m", "distgrad", "worker", "--name", "w", "--rank",
                          "0", "--world-size", "1", "--cpus", "4096"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--cpus: worker w cannot run on core(s) 4096" in out.stderr
