"""End-to-end tests on the testbed (root only; marker `testbed`)."""
