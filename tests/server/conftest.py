"""The server tests' fixtures (tiny model, servers) live in tests/conftest.py, shared
with tests/browser, tests/reliability and tests/conformance; see server_harness.py for
the client helpers."""
