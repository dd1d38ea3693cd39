//! Retained messages: delivery on subscribe and the zero-length clear (K1, K7).

use super::*;

fn retained_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    pubr.publish(&format!("{p}/a/b"), b"one", 1, true);
    pubr.publish(&format!("{p}/a/b"), b"two", 1, true); // the last one per topic is kept
    pubr.publish(&format!("{p}/a/c"), b"three", 0, true);
    pubr.publish(&format!("{p}/a/d"), b"not retained", 1, false);
    pubr.publish(&format!("{p}/x"), b"wait", 1, false); // QoS 0 above is processed before this PUBACK
    let mut sub = Raw::connect(addr, &format!("{p}-sub"));
    out.push(format!("suback {:?}", sub.subscribe(&[(&format!("{p}/a/+"), 1)])));
    let mut retained = vec![sub.expect_publish(), sub.expect_publish()];
    retained.sort();
    out.extend(retained.into_iter().map(|l| l.replace(&p, "P")));
    pubr.publish(&format!("{p}/a/b"), b"live", 1, true);
    out.push(sub.expect_publish().replace(&p, "P"));
    assert_eq!(sub.next(Duration::from_millis(100)), Next::Timeout, "nothing else arrives");
    out
}

same_on_both!(
    k1_retained_delivery_same_as_mosquitto,
    retained_scenario,
    ["suback [1]", "publish P/a/b \"two\" q1 r1", "publish P/a/c \"three\" q0 r1", "publish P/a/b \"live\" q1 r0",]
);

fn zero_length_retained_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let t = format!("{p}/state");
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    pubr.publish(&t, b"kept", 1, true);
    let mut early = Raw::connect(addr, &format!("{p}-early"));
    early.subscribe(&[(&t, 1)]);
    out.push(format!("early {}", early.expect_publish().replace(&p, "P")));
    pubr.publish(&t, b"", 1, true);
    out.push(format!("early {}", early.expect_publish().replace(&p, "P")));
    let mut late = Raw::connect(addr, &format!("{p}-late"));
    let sentinel = format!("{p}/sentinel");
    late.subscribe(&[(&t, 1), (&sentinel, 1)]);
    pubr.publish(&sentinel, b"s", 1, false);
    out.push(format!("late before sentinel: {:?}", until_sentinel(&mut late, &sentinel)));
    out
}

same_on_both!(
    k7_zero_length_retained_clears_same_as_mosquitto,
    zero_length_retained_scenario,
    ["early publish P/state \"kept\" q1 r1", "early publish P/state \"\" q1 r0", "late before sentinel: []"]
);
