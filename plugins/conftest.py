"""The plugins' tests: the same guard as the core suite's (nothing left running after a test)."""

pytest_plugins = ["autotune.testing.leaks"]
