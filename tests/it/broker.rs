//! Integration tests: broker.
