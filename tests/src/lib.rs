//! End-to-end tests that start the real binaries; see `tests/tests/`.
