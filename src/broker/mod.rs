//! The embedded MQTT 3.1.1 broker (CORE 11). Filled in by issue 3.
