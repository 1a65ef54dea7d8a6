"""Functions the test suite runs on workers (allowed there by the suite's rpc_world fixture)."""
