//! Integration tests: sign.
