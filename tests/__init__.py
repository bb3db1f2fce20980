"""ignis's tests, a package: helpers are imported absolutely (`from tests.server.server_harness import ...`)."""
