//! Broker lists (issue 19).
