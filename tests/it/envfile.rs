//! Integration tests: envfile.
