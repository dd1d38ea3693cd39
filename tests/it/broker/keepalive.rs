//! Keepalive: a silent client is dropped after 1.5 x keepalive, pings keep it (K5).

use super::*;

#[test]
fn k5_keepalive_1_without_pings_disconnects_within_2s() {
    let b = start();
    let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes("k5", 1, true, None, None));
    assert_eq!(code, 0);
    let t0 = Instant::now();
    c.expect_closed(Duration::from_secs(3));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    assert!(took >= Duration::from_millis(1400), "closed too early, after {took:?}");
    wait_log(&b, "keepalive timeout");
}

#[test]
fn k5_pings_keep_a_keepalive_1_client_alive() {
    let b = start();
    let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes("k5-ping", 1, true, None, None));
    assert_eq!(code, 0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(3500) {
        c.send(&encode(&mqttrs::Packet::Pingreq));
        assert_eq!(c.expect(), Got::Pingresp);
        assert_eq!(c.next(Duration::from_millis(500)), Next::Timeout);
    }
    assert_eq!(b.clients(), vec!["k5-ping".to_string()]);
}
