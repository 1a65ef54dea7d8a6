"""Test helpers: the ``rpc_world`` pytest fixture and functions for remote calls.

Functions that tests run remotely live in :mod:`distgrad.testing.rpc_funcs`: being
inside ``distgrad`` they are importable by every spawned worker and on the default
allowlist.
"""
