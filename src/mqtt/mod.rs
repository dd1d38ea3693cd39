//! The blocking MQTT 3.1.1 client, its configuration and the openssl TLS shim (CORE 3). Filled in by issue 3.
