//! Bad input: malformed and random packets; each case closes only its own connection while a
//! witness pair keeps round-tripping (CORE 11.2).

use super::*;

struct Witness {
    sub: Raw,
    pubr: Raw,
    n: u64,
}

impl Witness {
    fn new(addr: SocketAddr) -> Witness {
        let mut sub = Raw::connect(addr, "witness-sub");
        sub.subscribe(&[("witness/#", 1)]);
        Witness { sub, pubr: Raw::connect(addr, "witness-pub"), n: 0 }
    }
    fn round_trip(&mut self, after: &str) {
        self.n += 1;
        let payload = format!("{}", self.n);
        self.pubr.publish("witness/rt", payload.as_bytes(), 1, false);
        let got = self.sub.expect_publish();
        assert_eq!(got, format!("publish witness/rt {payload:?} q1 r0"), "round trip after {after}");
    }
}

fn bad_cfg() -> BrokerConfig {
    BrokerConfig { connect_timeout: Duration::from_millis(300), max_packet: 64 * 1024, ..cfg() }
}

fn connected(addr: SocketAddr) -> Raw {
    Raw::connect(addr, &format!("bad-{}", rand_hex(4)))
}

fn vm_rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn bad_input_named_cases_close_only_their_connection() {
    let b = broker::start(bad_cfg()).unwrap();
    let addr = b.addr();
    let mut w = Witness::new(addr);
    let rss_before = vm_rss_kb();

    let valid_connect = connect_bytes("bad-x", 60, true, None, None);
    let mut short_len = valid_connect.clone();
    short_len[1] -= 2; // remaining length two bytes short of the content
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        // (name, bytes, connect first, expected log fragment)
        ("truncated CONNECT", valid_connect[..7].to_vec(), false, "closed before CONNECT"),
        ("wrong remaining length", short_len, false, "protocol error"),
        ("256 MiB declared length", vec![0x30, 0xff, 0xff, 0xff, 0x7f], true, "exceeds max-packet 65536"),
        ("2 GB declared length (5-byte varint)", vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x07], true, "protocol error"),
        ("oversized CONNECT", vec![0x10, 0xff, 0xff, 0x7f], false, "exceeds max-packet"),
        ("DUP at QoS 0", vec![0x38, 3, 0, 1, b'a'], true, "DUP set at QoS 0"),
        ("+ in publish topic", vec![0x30, 5, 0, 3, b'a', b'/', b'+'], true, "invalid publish topic 'a/+'"),
        ("# in publish topic", vec![0x30, 3, 0, 1, b'#'], true, "invalid publish topic '#'"),
        ("empty publish topic", vec![0x30, 3, 0, 0, b'x'], true, "invalid publish topic ''"),
        ("PUBREL with flags 0", vec![0x60, 2, 0, 1], true, "malformed acknowledgement packet"),
        ("PUBREC with packet id 0", vec![0x50, 2, 0, 0], true, "malformed acknowledgement packet"),
        ("second CONNECT", valid_connect.clone(), true, "second CONNECT"),
        ("PUBLISH before CONNECT", vec![0x30, 3, 0, 1, b'a'], false, "first packet is not CONNECT"),
        ("reserved packet type", vec![0xf0, 0], true, "reserved packet type"),
        ("unknown protocol name", vec![0x10, 10, 0, 4, b'M', b'Q', b'X', b'X', 4, 2, 0, 60], false, "protocol name"),
    ];
    for (name, bytes, connect_first, log) in cases {
        let mut c = if connect_first { connected(addr) } else { Raw::open(addr) };
        c.send(&bytes);
        if name == "truncated CONNECT" {
            c.s.shutdown(Shutdown::Write).unwrap();
        }
        c.expect_closed(WAIT);
        wait_log(&b, log);
        w.round_trip(name);
    }

    // A client that connects and never speaks.
    let mut silent = Raw::open(addr);
    let t0 = Instant::now();
    silent.expect_closed(WAIT);
    assert!(t0.elapsed() >= Duration::from_millis(250), "closed before the first-packet timeout");
    wait_log(&b, "no CONNECT within 300 ms");
    w.round_trip("silent client");

    let grew = vm_rss_kb().saturating_sub(rss_before);
    assert!(grew < 100 * 1024, "huge declared lengths must not allocate (RSS grew {grew} kB)");
}

#[test]
fn bad_input_10000_random_byte_strings() {
    let b = broker::start(bad_cfg()).unwrap();
    let addr = b.addr();
    let mut w = Witness::new(addr);
    let connect = connect_bytes("rnd", 60, true, None, None);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for case in 0..10_000u32 {
        let len = (next() % 48) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if len >= 2 && next() % 2 == 0 {
            bytes[1] = (len - 2) as u8 & 0x7f; // a consistent length reaches the body decoders
        }
        let after_connect = next() % 2 == 0;
        let mut c = Raw::open(addr);
        if after_connect {
            c.send(&connect);
        }
        c.send(&bytes);
        let _ = c.s.shutdown(Shutdown::Write);
        c.expect_closed(WAIT);
        if case % 500 == 499 {
            w.round_trip(&format!("random case {case}"));
        }
    }
    w.round_trip("all random cases");
    assert_eq!(b.clients(), vec!["witness-pub".to_string(), "witness-sub".to_string()]);
}
