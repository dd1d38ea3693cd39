//! `mam watch`'s library side (CORE 8): the pure acceptance rules and budgets in `accept`; the
//! loop over the wire and events.log comes with the watch work (issue 6).

pub mod accept;
