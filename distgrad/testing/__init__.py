"""Test tooling for distgrad users.

``pytest_plugin``  the pytest plugin: ``rpc_world``, SPMD tests (``@pytest.mark.world``),
                   leak checks, hang reports, shared worlds
``world``          :class:`~distgrad.testing.world.World`: local worker processes, this
                   process as rank 0; kill/pause/resume, ``faults``
``forkserver``     starts those workers in milliseconds
``spmd``           one test function on every rank
``leaks``          what a test left behind, in every process of its world
``hangs``          every rank's stacks and pending calls, before the world is killed
``faults``         message faults: delay, drop, duplicate, fail
``harness``        the worlds of one test, and the worlds tests share
``remote``         the only functions a world's workers run for the harness
``oracle``         compares an op with PyTorch
``hosts``          simulated hosts: network namespaces on a switch, for multi-host tests
                   (the ``simulated_hosts`` fixture, ``distgrad hosts`` by hand)

Nothing here is callable over RPC by default; a World's workers allow ``remote`` only.
"""
