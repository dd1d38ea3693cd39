//! Integration tests: registry.
