//! Integration tests: paths.
