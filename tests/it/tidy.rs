//! Integration tests: tidy.
