//! `mam jobs`: the table and `--json` over a generated registry, with no broker, creating nothing.
