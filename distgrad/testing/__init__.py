"""Test tooling for distgrad users: the ``rpc_world`` pytest fixture (``pytest_plugin``),
the :class:`~distgrad.testing.world.World` of local worker processes it starts, and the
oracle that compares an op with PyTorch. Nothing here is callable over RPC."""
