//! Store and forward (issue 19): events recorded in events.log while no broker of the agent's list
//! was reachable reach a watcher on another node once a broker is back, in seq order and once
//! each, the terminal included: sent by the workspace daemon (a terminal leaves no timer behind)
//! or by the heartbeat timer's next beat. A watch of a job whose terminal is on disk needs no broker.

use std::time::Duration;

use super::{accepted, Machine, NatsCluster};
use crate::support::{free_port, poll, wait_until, TimerGuard};

/// The audit's `published` entries for `seq` that say it reached the wire.
fn confirmed(m: &Machine, id: &str, seq: u64) -> usize {
    m.audit(id).iter().filter(|e| e["kind"] == "published" && e["seq"] == seq && e["published"] == true).count()
}

#[test]
fn nats_an_outage_then_recovery_sends_the_unsent_events_and_the_terminal_once_in_order() {
    let td = crate::support::TestDir::new("mn-fwd");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let (a_node, c_node) = c.follower_and_other();
    // The agent's machine knows only its own node: while it is down, nothing reaches the wire.
    let agent = Machine::new("mn-fwd-a", c.list(&[a_node]));
    let watcher = Machine::new("mn-fwd-c", c.list(&[c_node]));
    let id = agent.register(1, 60);
    watcher.adopt(&agent, &id);
    let mut watch = watcher.watch(&id);
    // A plain subscriber of the job's events topic beside the watch: the watch may end on the
    // replayed retained state before the replayed events reach it (NATS does not order messages
    // across topics), the subscriber sees every event.
    let events_topic = format!("{}/events", watcher.record(&id)["topic_prefix"].as_str().unwrap());
    let mut sub =
        watcher.mam().args(["sub", "-d", "-t", &events_topic, "-C", "3", "-W", "90"]).spawn_bg(&watcher.td, "sub");
    let subscribed = poll(Duration::from_secs(15), || sub.stderr().contains("subscribed to").then_some(()));
    assert!(subscribed.is_some(), "mam sub did not subscribe: {}", sub.stderr());
    agent.publish(&id, "started", &[]).expect_rc(0);
    // The started event or the state it carries (the state may come first).
    watch.wait_stdout("advanced status=running", Duration::from_secs(10));
    c.nodes[a_node].kill();
    let during = |event: &str, msg: &str| {
        agent
            .mam()
            .env("MAM_PUBLISH_BUDGET_S", "2")
            .args(["publish", "--job-id", &id, "--event", event])
            .args(["--message", msg])
            .run()
    };
    // Recorded, not sent: rc 3 (CORE 6.3), the terminal too.
    during("progress", "while the broker was away").expect_rc(3);
    during("completed", "done while away").expect_rc(3);
    let unsent = agent.non_beats(&id);
    assert_eq!(unsent.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>(), ["started", "progress", "completed"]);
    assert!(!watch.exited());
    c.nodes[a_node].restart();
    c.wait_ready(a_node, Duration::from_secs(30)).unwrap();
    // The workspace daemon forwards what the outage left (the terminal left no timer to do it).
    let mut daemon = agent
        .mam()
        .env("MAM_DAEMON_SWEEP_S", "1")
        .args(["daemon", "run", "--workspace"])
        .args([agent.td.ws()])
        .spawn_bg(&agent.td, "daemon");
    daemon.wait_stdout("event(s) the wire had missed", Duration::from_secs(30));
    let (rc, _) = watch.wait(Duration::from_secs(20));
    let out = watch.stdout();
    let (sub_rc, _) = sub.wait(Duration::from_secs(20));
    daemon.signal(libc::SIGTERM);
    daemon.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{out}{}\n--- daemon\n{}", watch.stderr(), daemon.stdout());
    assert!(out.contains("result completed"), "{out}");
    // What the watch accepted is in seq order, each once (it may end on the state first).
    let acc: Vec<(u64, String)> = accepted(&out).into_iter().map(|(s, e, _)| (s, e)).collect();
    assert!(unsent.starts_with(&acc) && !acc.is_empty(), "{out}");
    // The subscriber got every event once, in seq order.
    assert_eq!(sub_rc, 0, "{}{}", sub.stdout(), sub.stderr());
    let got: Vec<(u64, String)> = sub
        .stdout()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["seq"].as_u64().unwrap(), v["event"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(got, unsent, "{}", sub.stdout());
    for (seq, _) in &unsent[1..] {
        assert_eq!(confirmed(&agent, &id, *seq), 1, "seq {seq} confirmed once by a replay");
    }
    let replayed = agent.audit(&id).iter().filter(|e| e["replayed"] == true).count();
    assert_eq!(replayed, 2, "{:?}", agent.audit(&id));
    assert!(daemon.stdout().contains("event(s) the wire had missed"), "{}", daemon.stdout());
}

#[test]
fn nats_the_timers_next_beat_sends_an_event_the_outage_left_unsent() {
    let td = crate::support::TestDir::new("mn-fwd2");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let (a_node, c_node) = c.follower_and_other();
    let agent = Machine::new("mn-fwd2-a", c.list(&[a_node]));
    let watcher = Machine::new("mn-fwd2-c", c.list(&[c_node]));
    let id = agent.register(1, 60);
    let _timers = TimerGuard(id.clone());
    watcher.adopt(&agent, &id);
    let mut watch = watcher.watch(&id);
    agent.publish(&id, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    watch.wait_stdout("event=progress", Duration::from_secs(10));
    c.nodes[a_node].kill();
    agent
        .mam()
        .env("MAM_PUBLISH_BUDGET_S", "2")
        .args(["publish", "--job-id", &id, "--event", "progress", "--message", "missed"])
        .run()
        .expect_rc(3);
    let missed = agent.non_beats(&id).last().unwrap().0;
    c.nodes[a_node].restart();
    c.wait_ready(a_node, Duration::from_secs(30)).unwrap();
    wait_until("the timer to send the missed event", Duration::from_secs(15), || confirmed(&agent, &id, missed) == 1);
    watch.wait_stdout(&format!("accepted seq={missed} event=progress"), Duration::from_secs(10));
    agent.publish(&id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(15));
    let out = watch.stdout();
    assert_eq!(rc, 0, "{out}{}", watch.stderr());
    let acc = accepted(&out);
    assert_eq!(acc.iter().filter(|(s, _, _)| *s == missed).count(), 1, "{out}");
    // In order: nothing newer than the missed event reached the watcher before it.
    let pos = acc.iter().position(|(s, _, _)| *s == missed).unwrap();
    assert!(acc[..pos].iter().all(|(s, _, _)| *s < missed), "{out}");
    assert!(agent.hb_log(&id).contains("sent earlier event(s) the wire had missed"), "{}", agent.hb_log(&id));
}

#[test]
fn watch_of_a_job_whose_terminal_is_on_disk_needs_no_broker() {
    let dead = free_port();
    let m = Machine::new("mn-disk", format!("127.0.0.1:{dead}"));
    let id = m.register(1, 4);
    m.mam()
        .env("MAM_PUBLISH_BUDGET_S", "1")
        .args(["publish", "--job-id", &id, "--event", "started"])
        .run()
        .expect_rc(3);
    m.publish(&id, "completed", &["--message", "ok"]).expect_rc(3);
    let r = m.mam().args(["watch", "--job-id", &id]).run_within(Duration::from_secs(10));
    r.expect_rc(0);
    assert!(r.stdout().contains("accepted seq=2 event=completed"), "{}", r.stdout());
    assert!(r.stdout().ends_with("result completed\n"), "{}", r.stdout());
    assert!(!r.stderr().contains("connect"), "no connect was tried: {}", r.stderr());
}

/// An event a one-shot publish could not send while the broker was up (it stalled the publisher's
/// CONNACK at that moment; the timer's connection stayed up) is sent by the timer's next beat over
/// its live connection: the timer sees that seqs were taken since its last beat and looks, without
/// any reconnect to prompt it.
#[test]
fn the_timers_live_connection_replays_an_event_a_publish_failed_to_send_while_the_broker_was_up() {
    let b = mam::broker::start(mam::broker::BrokerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        record: true,
        ..Default::default()
    })
    .unwrap();
    let agent = Machine::new("mn-fwd3", format!("127.0.0.1:{}", b.addr().port()));
    let id = agent.register(1, 60);
    let _timers = TimerGuard(id.clone());
    agent.publish(&id, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    wait_until("the timer's first beat", Duration::from_secs(10), || {
        agent.hb_log(&id).contains("delivered through broker")
    });
    // From now on the broker answers no one-shot publisher (the timer's connection is already up).
    b.stall_connack("mam-pub-");
    agent
        .mam()
        .env("MAM_PUBLISH_BUDGET_S", "2")
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "1")
        .args(["publish", "--job-id", &id, "--event", "progress", "--message", "while the broker was busy"])
        .run()
        .expect_rc(3);
    let missed = agent.non_beats(&id).last().unwrap().0;
    let failed =
        agent.audit(&id).iter().any(|e| e["kind"] == "published" && e["seq"] == missed && e["published"] == false);
    assert!(failed, "the publish audited its failure: {:?}", agent.audit(&id));
    wait_until("the timer to send the missed event", Duration::from_secs(10), || confirmed(&agent, &id, missed) == 1);
    // On the wire once, as the events.log line, through the timer's one connection.
    let line = agent.events(&id).into_iter().find(|e| e["seq"] == missed).unwrap();
    let on_wire: Vec<serde_json::Value> = b
        .received()
        .into_iter()
        .filter(|(t, _, _)| t.ends_with("/events"))
        .filter_map(|(_, p, _)| serde_json::from_slice(&p).ok())
        .filter(|v: &serde_json::Value| v["seq"] == missed)
        .collect();
    assert_eq!(on_wire, [line], "sent once, as recorded");
    let timers = b.connects().iter().filter(|c| c.starts_with("mam-hb-")).count();
    assert_eq!(timers, 1, "no reconnect prompted the replay: {:?}", b.connects());
    // The timer writes this line after the beat that carried the replay (and its state) was
    // acknowledged too, later than the replay's audit entry: waited for, not read at once (under
    // the full suite's load the two acknowledgements took long enough to lose that race).
    let line = format!("sent earlier event(s) the wire had missed: seq [{missed}]");
    let logged = poll(Duration::from_secs(10), || agent.hb_log(&id).contains(&line).then_some(()));
    assert!(logged.is_some(), "{}", agent.hb_log(&id));
    let replayed = agent.audit(&id).iter().filter(|e| e["seq"] == missed && e["replayed"] == true).count();
    assert_eq!(replayed, 1);
    b.release_connack("mam-pub-");
    agent.publish(&id, "completed", &[]).expect_rc(0);
}

/// Issue 31: every node of the agent's list is down while the job goes on: the timer keeps writing
/// beats to events.log, and `mam publish` records three progress events (rc 3). After the nodes
/// come back, a persistent-session subscriber (mosquitto_sub -c, subscribed before the outage)
/// gets every non-beat event, in seq order, the outage's included; beats made during the outage
/// are not replayed (a later beat says more), and the test names the seqs that never arrived.
#[test]
fn nats_a_full_outage_every_non_beat_event_reaches_a_persistent_session_subscriber_in_order() {
    let td = crate::support::TestDir::new("mn-full");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let agent = Machine::new("mn-full-a", c.list(&[0, 1, 2]));
    let id = agent.register(1, 120);
    let _timers = TimerGuard(id.clone());
    let prefix = agent.record(&id)["topic_prefix"].as_str().unwrap().to_string();
    let sid = format!("mamfull{}", crate::support::rand_hex(3));
    let sub = crate::support::MosqSub::start_persistent(c.nodes[2].mqtt, &format!("{prefix}/events"), &sid);
    agent.publish(&id, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    let got = |sub: &crate::support::MosqSub| -> Vec<(u64, bool, String)> {
        sub.messages(&prefix)
            .iter()
            .filter_map(|(_, p)| serde_json::from_str::<serde_json::Value>(p).ok())
            .map(|v| (v["seq"].as_u64().unwrap(), v["heartbeat"] == true, v["event"].as_str().unwrap().to_string()))
            .collect()
    };
    wait_until("beats at the subscriber", Duration::from_secs(15), || got(&sub).len() >= 3);
    for n in &mut c.nodes {
        n.kill();
    }
    let first_down = agent.events(&id).last().unwrap()["seq"].as_u64().unwrap() + 1;
    let beats_on_disk = |a: &Machine| a.events(&id).iter().filter(|e| e["heartbeat"] == true).count();
    for k in 1..=3 {
        // A beat of the timer between each two publishes: the outage's seqs interleave.
        let before = beats_on_disk(&agent);
        wait_until("a beat written during the outage", Duration::from_secs(10), || beats_on_disk(&agent) > before);
        agent
            .mam()
            .env("MAM_PUBLISH_BUDGET_S", "2")
            .args(["publish", "--job-id", &id, "--event", "progress", "--message", &format!("during the outage {k}")])
            .run()
            .expect_rc(3);
    }
    let last_down = agent.events(&id).last().unwrap()["seq"].as_u64().unwrap();
    for n in &mut c.nodes {
        n.restart();
    }
    for i in 0..3 {
        c.wait_ready(i, Duration::from_secs(30)).unwrap();
    }
    let outage: Vec<u64> =
        agent.non_beats(&id).into_iter().map(|(s, _)| s).filter(|s| (first_down..=last_down).contains(s)).collect();
    assert_eq!(outage.len(), 3, "{:?}", agent.non_beats(&id));
    let confirmed_all = || outage.iter().all(|s| confirmed(&agent, &id, *s) >= 1);
    wait_until("the outage's events sent", Duration::from_secs(30), confirmed_all);
    agent.publish(&id, "completed", &[]).expect_rc(0);
    let done = agent.non_beats(&id).last().unwrap().0;
    let arrived = poll(Duration::from_secs(30), || got(&sub).iter().any(|(s, _, _)| *s == done).then_some(()));
    let seen = got(&sub);
    let mut firsts: Vec<(u64, String)> = Vec::new();
    for (s, hb, e) in &seen {
        if !hb && !firsts.iter().any(|(f, _)| f == s) {
            firsts.push((*s, e.clone()));
        }
    }
    let missing: Vec<u64> = (first_down..=last_down).filter(|s| !seen.iter().any(|(x, _, _)| x == s)).collect();
    let missing_beats: Vec<u64> = missing
        .iter()
        .copied()
        .filter(|s| agent.events(&id).iter().any(|e| e["seq"] == *s && e["heartbeat"] == true))
        .collect();
    eprintln!("full outage: seqs {first_down}-{last_down} written during it; never arrived: {missing:?}, of them beats: {missing_beats:?}");
    assert!(arrived.is_some(), "the terminal did not arrive: {seen:?}\n{}", agent.hb_log(&id));
    assert_eq!(firsts, agent.non_beats(&id), "every non-beat event, in seq order: {seen:?}\n{}", agent.hb_log(&id));
    assert_eq!(missing, missing_beats, "only beats may be missing");
}
