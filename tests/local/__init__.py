"""Helpers that run only in the test process (unlike ``support``, which the suite's worlds
allow their workers to call)."""
