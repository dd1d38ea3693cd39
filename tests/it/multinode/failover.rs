//! Across nodes and through node failures (issue 19): a job published on NATS node A completes for
//! a watcher on node C; the node the heartbeat timer is connected to dies (SIGKILL) and the timer
//! moves to another node of its list within one beat period plus the connect deadline, so the
//! watcher elsewhere never closes the live job; the same on two bridged mosquittos. The leader-loss
//! test measures how long a NATS cluster stalls when the node leading the MQTT streams dies.

use std::time::Duration;

use super::{accepted, longest_gap, Bridged, Machine, NatsCluster, CONNECT_S};
use crate::support::{poll, wait_for, wait_until, TimerGuard};
use mam::mqtt::config::{window_floor_s, CLUSTER_STALL_S};

/// Every non-beat event on the agent's disk reached the remote watcher, each accepted once.
fn watcher_saw_every_event_once(agent: &Machine, id: &str, out: &str) {
    let acc = accepted(out);
    for (seq, ev) in agent.non_beats(id) {
        let n = acc.iter().filter(|(s, e, _)| *s == seq && *e == ev).count();
        assert_eq!(n, 1, "seq={seq} event={ev} accepted {n} times\n{out}");
    }
}

#[test]
fn nats_a_job_published_on_node_a_completes_for_a_watcher_on_node_c() {
    let td = crate::support::TestDir::new("mn-across");
    let Some(c) = NatsCluster::start(&td) else { return };
    let a = Machine::new("mn-across-a", c.list(&[0, 1, 2]));
    let cm = Machine::new("mn-across-c", c.list(&[2, 1, 0]));
    let id = a.register(1, 4);
    cm.adopt(&a, &id);
    let mut watch = cm.watch(&id);
    a.publish(&id, "started", &[]).expect_rc(0);
    a.publish(&id, "progress", &["--message", "half way"]).expect_rc(0);
    a.publish(&id, "completed", &["--message", "done"]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(15));
    let out = watch.stdout();
    assert_eq!(rc, 0, "{out}{}", watch.stderr());
    assert!(out.contains("result completed"), "{out}");
    watcher_saw_every_event_once(&a, &id, &out);
    // The agent's record kept the whole list; the watcher's names its own node first.
    let block = &a.record(&id)["broker"];
    assert_eq!(block["brokers"].as_array().unwrap().len(), 3, "{block}");
    assert_eq!(cm.record(&id)["broker"]["port"], c.nodes[2].mqtt);
}

/// The wall ms and broker of each `beat seq=N delivered through broker ADDR` line of heartbeat.log.
fn deliveries(hb: &str) -> Vec<(u64, String)> {
    hb.lines()
        .filter_map(|l| {
            let (ts, rest) = l.split_once(' ')?;
            let addr = rest.split_once(" delivered through broker ")?.1;
            Some((mam::clock::parse_ts(ts)?, addr.to_string()))
        })
        .collect()
}

/// What one failover run measured (ms).
struct Failover {
    /// Node killed -> the first beat acknowledged through another node (heartbeat.log).
    timer_ms: u64,
    /// The longest time the remote watcher went without evidence.
    gap_ms: u64,
}

/// Kills the node the timer is connected to (`kill`, whose address is `killed_addr`) while a
/// watcher on another node follows the job, then completes it.
fn timer_failover(
    agent: &Machine,
    watcher: &Machine,
    kill: &mut dyn FnMut(),
    killed_addr: &str,
    n: u64,
    k: u64,
) -> Failover {
    let id = agent.register(n, k);
    let _timers = TimerGuard(id.clone());
    watcher.adopt(agent, &id);
    let mut watch = watcher.watch(&id);
    agent.publish(&id, "started", &["--heartbeat", &n.to_string(), "--watch-pid", "0"]).expect_rc(0);
    wait_until("a beat through the first broker", Duration::from_secs(10), || {
        deliveries(&agent.hb_log(&id)).iter().any(|(_, a)| a == killed_addr)
    });
    watch.wait_stdout("event=progress", Duration::from_secs(10));
    kill();
    let killed = mam::clock::now_ms();
    // A beat acknowledged through another node, after the kill.
    let moved = wait_for("a beat through another node", Duration::from_secs(25), || {
        deliveries(&agent.hb_log(&id)).into_iter().find(|(t, a)| *t >= killed && a != killed_addr).map(|(t, _)| t)
    });
    let before = accepted(&watch.stdout()).len();
    wait_until("beats at the watcher again", Duration::from_secs(20), || accepted(&watch.stdout()).len() >= before + 2);
    assert!(!watch.exited(), "the watcher kept the live job\n{}{}", watch.stdout(), watch.stderr());
    agent.publish(&id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(20));
    let out = watch.stdout();
    assert_eq!(rc, 0, "completed, not closed unresponsive\n{out}{}", watch.stderr());
    watcher_saw_every_event_once(agent, &id, &out);
    let f = Failover { timer_ms: moved.saturating_sub(killed), gap_ms: longest_gap(&out) };
    eprintln!(
        "failover: node killed -> beat through another node {} ms ({:.2} x N); longest silence at the watcher {} ms \
         (N={n}s, K x N={}s, connect deadline {CONNECT_S}s)",
        f.timer_ms,
        f.timer_ms as f64 / (n * 1000) as f64,
        f.gap_ms,
        n * k
    );
    f
}

#[test]
fn nats_killing_the_timers_node_moves_the_timer_on_without_a_missed_window() {
    let td = crate::support::TestDir::new("mn-kill");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    // The timer's node leads as little as a node can (`follower`); killing it can still stall the
    // cluster (a consumer's leader, or a group's when every node leads one), so K x N is the floor.
    let (victim, other) = c.follower_and_other();
    let third = 3 - victim - other;
    let agent = Machine::new("mn-kill-a", c.list(&[victim, other, third]));
    let watcher = Machine::new("mn-kill-c", c.list(&[third, other, victim]));
    let addr = c.nodes[victim].addr();
    let n = 1;
    let k = window_floor_s(n, CONNECT_S);
    let f = timer_failover(&agent, &watcher, &mut || c.nodes[victim].kill(), &addr, n, k);
    assert!(f.gap_ms < n * k * 1000, "longest silence {} ms is under K x N", f.gap_ms);
    assert!(f.timer_ms <= (CLUSTER_STALL_S + n + CONNECT_S) * 1000, "timer failover {} ms", f.timer_ms);
}

#[test]
fn bridged_mosquittos_killing_the_timers_broker_moves_the_timer_to_the_other() {
    let td = crate::support::TestDir::new("mn-bridge");
    let Some(mut br) = Bridged::start(&td) else { return };
    let agent = Machine::new("mn-bridge-a", br.list(true));
    let watcher = Machine::new("mn-bridge-b", format!("127.0.0.1:{}", br.b.port));
    let addr = format!("127.0.0.1:{}", br.a.port);
    // Mosquitto does not stall: the window may be as short as one beat plus the connect deadline.
    let (n, k) = (1, 1 + CONNECT_S + 1);
    let f = timer_failover(&agent, &watcher, &mut || br.a.kill(), &addr, n, k);
    // Issue 19's target: failover within one beat period plus the connect deadline.
    assert!(f.timer_ms <= (n + CONNECT_S) * 1000, "timer failover {} ms", f.timer_ms);
    assert!(f.gap_ms <= (n + CONNECT_S) * 1000, "longest silence {} ms", f.gap_ms);
}

#[test]
fn bridged_mosquittos_a_job_published_on_one_completes_for_a_watcher_on_the_other() {
    let td = crate::support::TestDir::new("mn-bridge2");
    let Some(br) = Bridged::start(&td) else { return };
    let a = Machine::new("mn-bridge2-a", br.list(true));
    let b = Machine::new("mn-bridge2-b", br.list(false));
    let id = a.register(1, 4);
    b.adopt(&a, &id);
    let mut watch = b.watch(&id);
    a.publish(&id, "started", &[]).expect_rc(0);
    a.publish(&id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(15));
    let out = watch.stdout();
    assert_eq!(rc, 0, "{out}{}", watch.stderr());
    watcher_saw_every_event_once(&a, &id, &out);
}

/// Issue 19's measurement: the MQTT streams' leader dies while a job beats every second through
/// another node; the longest silence the watcher sees is the cluster's stall. Printed, and
/// bounded by the floor docs/CLUSTER.md documents for K x N on NATS.
#[test]
fn nats_leader_loss_stalls_the_cluster_for_less_than_the_documented_floor() {
    let td = crate::support::TestDir::new("mn-leader");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let Some(leader) = c.leader("$MQTT_msgs") else { panic!("no leader of $MQTT_msgs") };
    let victim = c.index_of(&leader);
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let agent = Machine::new("mn-leader-a", c.list(&[others[0], others[1], victim]));
    let watcher = Machine::new("mn-leader-c", c.list(&[others[1], others[0], victim]));
    let id = agent.register(1, window_floor_s(1, CONNECT_S));
    let _timers = TimerGuard(id.clone());
    watcher.adopt(&agent, &id);
    let mut watch = watcher.watch(&id);
    agent.publish(&id, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    wait_until("beats at the watcher", Duration::from_secs(10), || accepted(&watch.stdout()).len() >= 3);
    let before = accepted(&watch.stdout()).len();
    c.nodes[victim].kill();
    wait_until("beats after the stall", Duration::from_secs(25), || accepted(&watch.stdout()).len() >= before + 3);
    agent.publish(&id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(20));
    let out = watch.stdout();
    assert_eq!(rc, 0, "{out}{}", watch.stderr());
    let gap = longest_gap(&out);
    eprintln!("leader loss: {leader} ($MQTT_msgs) killed; longest silence at the watcher {gap} ms");
    assert!(gap < CLUSTER_STALL_S * 1000, "stall {gap} ms is under the documented {CLUSTER_STALL_S} s");
}

/// A watch of `id` on `watcher` sees `started`; `kill` takes its broker away; the agent publishes
/// `completed` meanwhile (only the retained state can bring it); the watch, back within `limit`,
/// accepts that state. The terminal's seq and what the watch printed.
fn watcher_away_for_the_terminal(
    agent: &Machine,
    watcher: &Machine,
    id: &str,
    kill: impl FnOnce(),
    limit: Duration,
) -> (u64, String) {
    let mut watch = watcher.watch(id);
    agent.publish(id, "started", &[]).expect_rc(0);
    watch.wait_stdout("event=started", Duration::from_secs(10));
    kill();
    watch.wait_stdout("broker down", Duration::from_secs(10));
    agent.publish(id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(limit);
    let out = watch.stdout();
    assert_eq!(rc, 0, "{out}{}", watch.stderr());
    let seq = agent.record(id)["last_seq"].as_u64().unwrap();
    let back = &out[out.find("broker up").unwrap_or_else(|| panic!("no reconnect\n{out}"))..];
    assert!(back.contains(&format!("accepted-state seq={seq} status=completed")), "{out}");
    (seq, out)
}

/// The agent's side holds each seq once in events.log and published each event once.
fn each_event_once(agent: &Machine, id: &str, seq: u64) {
    let seqs: Vec<u64> = agent.events(id).iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seq).collect::<Vec<u64>>(), "events.log holds each seq once");
    let published: Vec<u64> = agent
        .audit(id)
        .iter()
        .filter(|e| e["kind"] == "published" && e["published"] == true)
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(published, [1, seq], "each event published once");
}

/// The watcher's broker dies: the watch reconnects through its list to the other broker and finds
/// the terminal that was published meanwhile in the retained state. The NATS version is
/// `nats_killing_the_watchers_node_...`.
#[test]
fn bridged_mosquittos_killing_the_watchers_broker_the_watch_reconnects_and_recovers_the_terminal() {
    let td = crate::support::TestDir::new("mn-wkill");
    let Some(mut br) = Bridged::start(&td) else { return };
    let agent = Machine::new("mn-wkill-a", format!("127.0.0.1:{}", br.a.port));
    let watcher = Machine::new("mn-wkill-b", br.list(false));
    let id = agent.register(1, 10);
    watcher.adopt(&agent, &id);
    let (seq, _) = watcher_away_for_the_terminal(&agent, &watcher, &id, || br.b.kill(), Duration::from_secs(20));
    // Restart the killed broker: nothing is duplicated on the agent's side.
    br.b.launch();
    each_event_once(&agent, &id, seq);
}

#[test]
fn nats_a_remote_job_is_dispatched_on_node_a_and_run_on_node_c() {
    let td = crate::support::TestDir::new("mn-remote");
    let Some(c) = NatsCluster::start(&td) else { return };
    let secret = crate::support::rand_hex(16);
    let orch = Machine::new("mn-remote-a", c.list(&[0, 1, 2]));
    let box_ = Machine::new("mn-remote-c", c.list(&[2, 1, 0]));
    let session = format!("r{}", crate::support::rand_hex(3));
    let k = window_floor_s(1, CONNECT_S).to_string();
    let id = format!("m{}", crate::support::rand_hex(4));
    let reg = ["registry", "register", "--session", &format!("remote:{session}"), "--job-id", &id];
    let timing = ["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", &k, "--ack-timeout", "20"];
    orch.mam().env("MAM_DISPATCH_SECRET", &secret).args(reg).args(timing).run().expect_rc(0);
    let mut watch = orch
        .mam()
        .env("MAM_DISPATCH_SECRET", &secret)
        .args(["watch", "--job-id", &id, "--remote"])
        .spawn_bg(&orch.td, "watch");
    crate::watch::wait_lines(&mut watch, "subscribed topic=", 2);
    let runner_reg = box_.registry();
    let exec = r#"echo "ran $MAM_JOB_ID on the far node" > "$MAM_REPORT_FILE""#;
    let mut run = box_
        .mam()
        .env("MAM_DISPATCH_SECRET", &secret)
        .args(["remote", "run", "--session", &session, "--exec", exec, "--once", "--registry-dir"])
        .args([&runner_reg])
        .spawn_bg(&box_.td, "runner");
    run.wait_stdout("subscribed topic=", Duration::from_secs(15));
    let r = orch.mam().env("MAM_DISPATCH_SECRET", &secret).args(["remote", "dispatch", "--job-id", &id]).run();
    r.expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(25));
    assert_eq!(rc, 0, "{}{}\n--- runner\n{}{}", watch.stdout(), watch.stderr(), run.stdout(), run.stderr());
    let (rrc, _) = run.wait(Duration::from_secs(15));
    assert_eq!(rrc, 0, "{}{}", run.stdout(), run.stderr());
    assert_eq!(orch.record(&id)["status"], "completed");
    let report = std::fs::read_to_string(orch.registry().join(&id).join("report.md")).unwrap();
    assert_eq!(report, format!("ran {id} on the far node\n"));
    // The runner's record names its own node first.
    assert_eq!(box_.record(&id)["broker"]["port"], c.nodes[2].mqtt);
}

/// The same fault on NATS: the watcher's node dies, the watch reconnects through its list to
/// another node and recovers the terminal, published meanwhile, from the retained state; the killed
/// node restarted, nothing is duplicated and it serves the terminal state too.
///
/// Why this was unreliable before (docs/CLUSTER.md): a node that leads none of the MQTT streams and
/// not the meta group still leads JetStream consumers, among them every server's
/// `$MQTT_rmsgs_<server>` (which feeds that server's in-memory copy of the retained messages) and
/// the consumers of the sessions connected to it. Its death stalls them until they elect new
/// leaders (about 5-7 s): a terminal's retained state published meanwhile is acknowledged but
/// reaches the other servers' copies only then, so a watch back within that window was handed the
/// stale state and waited out its window; and the elections slow the JetStream API, so a
/// reconnecting subscriber's consumers missed NATS's 4 s timeout (SUBACK 0x80) again and again.
/// So the node killed leads nothing at all: not the meta group, and every stream and consumer
/// leadership moved off it first (`evacuate`), as an operator drains a node before maintenance.
#[test]
fn nats_killing_the_watchers_node_the_watch_reconnects_and_recovers_the_terminal() {
    let td = crate::support::TestDir::new("mn-nwkill");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let meta = c.meta_leader();
    let victim = match c.follower() {
        v if Some(&c.nodes[v].name) == meta.as_ref() => (v + 1) % 3,
        v => v,
    };
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let agent = Machine::new("mn-nwkill-a", c.list(&[others[0]]));
    let watcher = Machine::new("mn-nwkill-c", c.list(&[victim, others[1], others[0]]));
    let id = agent.register(1, 30);
    watcher.adopt(&agent, &id);
    let kill = || {
        c.evacuate(victim);
        assert_ne!(c.meta_leader().as_ref(), Some(&c.nodes[victim].name), "the meta leader did not move to the victim");
        c.nodes[victim].kill();
    };
    // Measured 1.6-15 s back (docs/CLUSTER.md): the cluster keeps the dead node in new consumers.
    let (seq, out) = watcher_away_for_the_terminal(&agent, &watcher, &id, kill, Duration::from_secs(25));
    // Restart the killed node: it catches up, and nothing is duplicated.
    c.nodes[victim].restart();
    c.wait_ready(victim, Duration::from_secs(30)).unwrap();
    let prefix = agent.record(&id)["topic_prefix"].as_str().unwrap().to_string();
    let r = watcher
        .mam()
        .args(["sub", "-h", &c.nodes[victim].addr(), "-t", &format!("{prefix}/state"), "-C", "1", "-W", "15"])
        .run_within(Duration::from_secs(20));
    r.expect_rc(0);
    let state: serde_json::Value = serde_json::from_str(r.stdout().trim()).unwrap();
    assert_eq!((state["seq"].as_u64(), state["status"].as_str()), (Some(seq), Some("completed")), "{state}");
    each_event_once(&agent, &id, seq);
    // The watcher's machine holds the one record it adopted, nothing else.
    let mut records: Vec<String> = std::fs::read_dir(watcher.registry())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    records.sort();
    assert_eq!(records, [".registry.lock".to_string(), format!("{id}.json")]);
    let ms = |l: &str| {
        out.lines().find(|x| x.ends_with(l)).and_then(|x| mam::clock::parse_ts(x.split(' ').next()?)).unwrap()
    };
    eprintln!(
        "watcher's node killed: the watch was back through another node after {} ms",
        ms(" broker up") - ms(" broker down")
    );
}

/// `(seq, heartbeat)` of each JSON event payload of `lines` (`TOPIC PAYLOAD` or the payload alone).
fn event_seqs<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<(u64, bool)> {
    lines
        .filter_map(|l| {
            let json = &l[l.find('{')?..];
            let v: serde_json::Value = serde_json::from_str(json).ok()?;
            Some((v["seq"].as_u64()?, v["heartbeat"] == true))
        })
        .collect()
}

/// Issue 31: the node the heartbeat timer is connected to dies (drained first, so the cluster
/// itself does not stall: what is left is mam's failover); a beat made after the death reaches a
/// subscriber on another node within N + 3 s. Before the fix the timer's reconnect met the other
/// nodes closing new sessions before CONNACK, gave the beat up, and tried again a beat later.
#[test]
fn nats_killing_the_timers_node_a_beat_reaches_a_subscriber_on_another_node_within_n_plus_3_s() {
    let td = crate::support::TestDir::new("mn-beat");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let victim = c.sessions_leader_only();
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let agent = Machine::new("mn-beat-a", c.list(&[victim, others[0], others[1]]));
    let n = 1;
    let id = agent.register(n, window_floor_s(n, CONNECT_S));
    let _timers = TimerGuard(id.clone());
    let prefix = agent.record(&id)["topic_prefix"].as_str().unwrap().to_string();
    let sub = crate::support::MosqSub::start(c.nodes[others[1]].mqtt, &format!("{prefix}/events"));
    agent.publish(&id, "started", &["--heartbeat", &n.to_string(), "--watch-pid", "0"]).expect_rc(0);
    let addr = c.nodes[victim].addr();
    wait_until("a beat through the victim", Duration::from_secs(10), || {
        deliveries(&agent.hb_log(&id)).iter().any(|(_, a)| *a == addr)
    });
    let beats = |sub: &crate::support::MosqSub| {
        let msgs = sub.messages(&prefix);
        event_seqs(msgs.iter().map(|(_, p)| p.as_str())).into_iter().filter(|(_, hb)| *hb).count()
    };
    wait_until("beats at the subscriber", Duration::from_secs(10), || beats(&sub) >= 2);
    wait_until("the timer's standby connection", Duration::from_secs(10), || {
        agent.hb_log(&id).contains("standby connection to broker")
    });
    // The subscriber's consumers are moved off too (they were made after the choice).
    c.evacuate_keeping(victim, Some("$MQTT_sess"));
    c.nodes[victim].kill();
    let killed = std::time::Instant::now();
    // Every beat with a seq above the last one on disk now was made after the death.
    let last = agent.events(&id).last().unwrap()["seq"].as_u64().unwrap();
    let after = wait_for("a beat made after the death at the subscriber", Duration::from_secs(30), || {
        let msgs = sub.messages(&prefix);
        event_seqs(msgs.iter().map(|(_, p)| p.as_str()))
            .iter()
            .any(|(s, hb)| *hb && *s > last)
            .then(std::time::Instant::now)
    });
    let ms = after.duration_since(killed).as_millis() as u64;
    eprintln!("node death -> next beat delivered on another node: {ms} ms (N = {n} s)\n{}", agent.hb_log(&id));
    assert!(ms <= (n + 3) * 1000, "{ms} ms is over N + 3 s\n{}", agent.hb_log(&id));
}

/// Issue 31: `mam sub` follows its broker list across its node's death like every long-lived
/// client: it reconnects to the next node, subscribes again, says so in one line on stderr, and
/// goes on printing; before, it exited 3 when its connection dropped.
#[test]
fn nats_mam_sub_follows_its_broker_list_across_its_nodes_death() {
    let td = crate::support::TestDir::new("mn-sub");
    let Some(mut c) = NatsCluster::start(&td) else { return };
    let victim = c.victim();
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let agent = Machine::new("mn-sub-a", c.list(&[others[0]]));
    let id = agent.register(1, 60);
    let _timers = TimerGuard(id.clone());
    let topic = format!("{}/events", agent.record(&id)["topic_prefix"].as_str().unwrap());
    let mut sub = agent
        .mam()
        .env("MQTT_BROKER", c.list(&[victim, others[1], others[0]]))
        .args(["sub", "-d", "-t", &topic])
        .spawn_bg(&agent.td, "sub");
    wait_until("mam sub to subscribe", Duration::from_secs(15), || sub.stderr().contains("subscribed to"));
    agent.publish(&id, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    wait_until("beats at mam sub", Duration::from_secs(10), || event_seqs(sub.stdout().lines()).len() >= 2);
    let killed = c.drain_and_kill(victim);
    let last = agent.events(&id).last().unwrap()["seq"].as_u64().unwrap();
    let back = poll(Duration::from_secs(30), || {
        event_seqs(sub.stdout().lines()).iter().any(|(s, _)| *s > last).then(std::time::Instant::now)
    });
    let err = sub.stderr();
    assert!(back.is_some(), "no beat after the death at mam sub (exited: {})\n{err}", sub.exited());
    eprintln!("mam sub: node death -> next message {} ms", back.unwrap().duration_since(killed).as_millis());
    let moved: Vec<&str> = err.lines().filter(|l| l.contains("now connected to")).collect();
    let want = format!("NOTE: sub: connection to {} lost", c.nodes[victim].addr());
    assert_eq!(moved.len(), 1, "one line for the move\n{err}");
    assert!(moved[0].starts_with(&want) && moved[0].ends_with(&c.nodes[others[1]].addr()), "{err}");
    sub.signal(libc::SIGTERM);
    let (rc, _) = sub.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{err}");
}
