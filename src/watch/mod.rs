//! `mam watch`'s library side (CORE 8): the pure acceptance rules and budgets in `accept`, the
//! events.log reader in `tail`, and the loop over the wire and events.log in `follow`.

pub mod accept;
pub mod follow;
pub mod tail;
