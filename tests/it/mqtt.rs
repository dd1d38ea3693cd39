//! Integration tests: mqtt.
