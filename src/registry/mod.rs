//! The job registry and the transition engine (CORE 4, 5). Filled in by issue 4.
