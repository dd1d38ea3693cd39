//! Canonical JSON and HMAC-SHA256 signatures (CORE 6.2). Filled in by issue 5.
