//! The broker's lifecycle through the API: the loopback-only bind, dropping connections, shutdown (K9).

use super::*;

#[test]
fn k9_api_refuses_non_loopback_bind_without_allow_remote() {
    let e = broker::start(BrokerConfig { bind: "0.0.0.0:0".parse().unwrap(), ..cfg() }).err().unwrap();
    assert_eq!(e.to_string(), "refusing to bind non-loopback address without --allow-remote");
}

#[test]
fn drop_connections_closes_clients_and_keeps_listening() {
    let b = start();
    let mut c1 = Raw::connect(b.addr(), "d1");
    let mut c2 = Raw::connect(b.addr(), "d2");
    b.drop_connections();
    c1.expect_closed(WAIT);
    c2.expect_closed(WAIT);
    let mut c3 = Raw::connect(b.addr(), "d1");
    c3.publish("d/x", b"x", 1, false);
}

#[test]
fn shutdown_closes_clients_and_the_listener() {
    let b = start();
    let addr = b.addr();
    let mut c = Raw::connect(addr, "sd");
    b.stall_connack("never-");
    let mut stalled = Raw::open(addr);
    stalled.send(&connect_bytes("never-1", 60, true, None, None));
    let t0 = Instant::now();
    b.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    c.expect_closed(WAIT);
    stalled.expect_closed(WAIT);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "listener closed");
}
