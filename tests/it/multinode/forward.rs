//! Store and forward (issue 19).
