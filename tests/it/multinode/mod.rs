//! Beyond one machine (issue 19): a 3-node NATS cluster (JetStream and the MQTT gateway on loopback,
//! each node with its own store directory) and two bridged mosquittos as fixtures, and "machines":
//! a control root of their own with a broker list that names their nearest node first. A job's
//! record is copied from the agent's machine to the watcher's, which re-points it at its own node
//! (`mam registry repoint`), so the watcher has no events.log to read: only the wire.
//!
//! Every server is a real process killed with a real SIGKILL; every wait has a deadline.

mod check;
mod failover;
mod forward;
mod lists;

use std::fs;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{free_port, have_tool, poll, rand_hex, wait_until, Background, Cmd, Mosquitto, TestDir};

/// The connect deadline every machine uses (`MAM_MQTT_CONNECT_TIMEOUT_S`): above NATS's own 4 s
/// JetStream API timeout, which a CONNECT or SUBSCRIBE waits for while the cluster fails over.
pub const CONNECT_S: u64 = 5;

/// True when nats-server is there; a missing one skips with a line unless `MAM_REQUIRE_NATS=1`.
pub fn have_nats() -> bool {
    have_tool("nats-server", "MAM_REQUIRE_NATS")
}

/// A JetStream raft group of the MQTT gateway: a stream, or a consumer of it.
pub type Group = (String, Option<String>);

/// One nats-server of a cluster.
pub struct NatsNode {
    pub name: String,
    pub mqtt: u16,
    pub http: u16,
    /// The core NATS client port (the JetStream API: stepdown requests).
    pub client: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl NatsNode {
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.mqtt)
    }

    fn launch(&mut self) {
        let log = fs::File::create(&self.log).unwrap();
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
    }

    /// Starts the node again on its ports and store (after `kill`).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NatsNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three nats-servers in one cluster with JetStream and MQTT (server names are required by both).
/// One cluster runs at a time in the test binary: two on the suite's two cores made JetStream miss
/// its own 4 s API timeouts (a reconnecting subscriber's consumers were never made in time).
pub struct NatsCluster {
    pub nodes: Vec<NatsNode>,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl NatsCluster {
    /// Starts the cluster and waits until every node's MQTT gateway answers CONNECT; `None` when
    /// nats-server is absent (and not required).
    pub fn start(td: &TestDir) -> Option<NatsCluster> {
        if !have_nats() {
            return None;
        }
        let mut last = String::new();
        for _ in 0..3 {
            let turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
            match NatsCluster::try_start(td, turn) {
                Ok(c) => return Some(c),
                Err(e) => last = e,
            }
        }
        panic!("the NATS cluster did not start: {last}");
    }

    fn try_start(td: &TestDir, turn: std::sync::MutexGuard<'static, ()>) -> Result<NatsCluster, String> {
        let tag = rand_hex(3);
        let ports: Vec<[u16; 4]> = (0..3).map(|_| [free_port(), free_port(), free_port(), free_port()]).collect();
        let routes: Vec<String> = ports.iter().map(|p| format!("nats://127.0.0.1:{}", p[1])).collect();
        let mut nodes = Vec::new();
        for (i, p) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let store = td.path(&format!("nats-{tag}/{name}"));
            fs::create_dir_all(&store).unwrap();
            let conf = format!(
                "server_name: {name}\nlisten: 127.0.0.1:{}\nhttp: 127.0.0.1:{}\njetstream {{ store_dir: \"{}\" }}\n\
                 cluster {{ name: mamtest\n  listen: 127.0.0.1:{}\n  routes: [{}] }}\nmqtt {{ listen: 127.0.0.1:{} }}\n",
                p[0],
                p[2],
                store.display(),
                p[1],
                routes.join(", "),
                p[3]
            );
            let conf_path = td.write(&format!("nats-{tag}/{name}.conf"), conf);
            let log = td.path(&format!("nats-{tag}/{name}.log"));
            let mut n = NatsNode { name, mqtt: p[3], http: p[2], client: p[0], conf: conf_path, log, child: None };
            n.launch();
            nodes.push(n);
        }
        let mut c = NatsCluster { nodes, _one_at_a_time: turn };
        for i in 0..3 {
            c.wait_ready(i, Duration::from_secs(30))?;
        }
        Ok(c)
    }

    /// Waits until node `i` answers an MQTT CONNECT with CONNACK 0 (JetStream up, streams made).
    pub fn wait_ready(&mut self, i: usize, limit: Duration) -> Result<(), String> {
        let addr = self.nodes[i].addr();
        let ok = poll(limit, || {
            if !self.nodes[i].alive() {
                return Some(false);
            }
            mqtt_answers(&addr, Duration::from_secs(5)).then_some(true)
        });
        match ok {
            Some(true) => Ok(()),
            other => {
                let why = if other.is_some() { "exited" } else { "no CONNACK" };
                Err(format!("{} {why}; log:\n{}", self.nodes[i].name, self.nodes[i].log_text()))
            }
        }
    }

    /// `host:port` of the nodes in `order`, comma-separated: a broker list.
    pub fn list(&self, order: &[usize]) -> String {
        order.iter().map(|&i| self.nodes[i].addr()).collect::<Vec<_>>().join(",")
    }

    /// The node that leads `stream` (`$MQTT_msgs`, `$MQTT_sess`, `$MQTT_rmsgs`), asked of a live node.
    pub fn leader(&mut self, stream: &str) -> Option<String> {
        let http: Vec<u16> =
            self.nodes.iter_mut().filter_map(|n| if n.alive() { Some(n.http) } else { None }).collect();
        for port in http {
            let Some(body) = http_get(port, "/jsz?streams=true") else { continue };
            let Ok(v) = serde_json::from_str::<Value>(&body) else { continue };
            for acc in v["account_details"].as_array().into_iter().flatten() {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    if s["name"] == stream {
                        if let Some(l) = s["cluster"]["leader"].as_str() {
                            return Some(l.to_string());
                        }
                    }
                }
            }
        }
        None
    }

    /// The JetStream meta leader (which stream and consumer creation need: a fresh MQTT session's
    /// CONNECT and every QoS 1 SUBSCRIBE).
    pub fn meta_leader(&mut self) -> Option<String> {
        let http: Vec<u16> =
            self.nodes.iter_mut().filter_map(|n| if n.alive() { Some(n.http) } else { None }).collect();
        http.into_iter().find_map(|port| {
            let v = serde_json::from_str::<Value>(&http_get(port, "/jsz")?).ok()?;
            v["meta_cluster"]["leader"].as_str().map(str::to_string)
        })
    }

    /// `follower()`, and the first other node: a node to kill and one that stays up.
    pub fn follower_and_other(&mut self) -> (usize, usize) {
        let victim = self.follower();
        (victim, (0..3).find(|&i| i != victim).unwrap())
    }

    /// The index of the node whose death stalls the least: one that leads neither the JetStream
    /// meta group nor any MQTT stream when there is one, else one that leads only `$MQTT_rmsgs`
    /// (retained messages) or as little as that. The leaders are read until they have not changed
    /// for 300 ms (they move while the streams settle).
    pub fn follower(&mut self) -> usize {
        // What each of the four groups' loss costs: the meta group, sessions and messages stall
        // connects and deliveries; the retained store only delays a new subscriber's retained copy.
        const GROUPS: [(&str, u32); 3] = [("$MQTT_msgs", 4), ("$MQTT_sess", 4), ("$MQTT_rmsgs", 1)];
        let read = |c: &mut NatsCluster| {
            let mut l: Vec<(String, u32)> = GROUPS.iter().filter_map(|(s, w)| c.leader(s).map(|n| (n, *w))).collect();
            l.extend(c.meta_leader().map(|n| (n, 4)));
            l
        };
        let mut last = read(self);
        let mut since = std::time::Instant::now();
        let settled = poll(Duration::from_secs(10), || {
            let now = read(self);
            if now != last || now.len() != 4 {
                last = now;
                since = std::time::Instant::now();
                return None;
            }
            (since.elapsed() >= Duration::from_millis(300)).then_some(())
        });
        assert!(settled.is_some(), "the NATS leaders did not settle: {last:?}");
        let cost = |i: usize| last.iter().filter(|(n, _)| *n == self.nodes[i].name).map(|(_, w)| w).sum::<u32>();
        (0..3).min_by_key(|&i| cost(i)).unwrap()
    }

    /// Every stream and consumer of the MQTT gateway whose leader is `name`, as `(stream,
    /// consumer)` (`None` for the stream itself), and how many have no leader, read from a live node.
    pub fn led_by(&mut self, name: &str) -> Option<(Vec<Group>, usize)> {
        let http: Vec<u16> =
            self.nodes.iter_mut().filter_map(|n| if n.alive() { Some(n.http) } else { None }).collect();
        http.into_iter().find_map(|port| {
            let v = serde_json::from_str::<Value>(&http_get(port, "/jsz?streams=true&consumers=true")?).ok()?;
            let (mut led, mut leaderless) = (Vec::new(), 0);
            for acc in v["account_details"].as_array()? {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    let stream = s["name"].as_str()?.to_string();
                    let groups = std::iter::once((&s["cluster"], None)).chain(
                        s["consumer_detail"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| (&c["cluster"], c["name"].as_str())),
                    );
                    for (cluster, consumer) in groups {
                        match cluster["leader"].as_str() {
                            Some(l) if l == name => led.push((stream.clone(), consumer.map(str::to_string))),
                            Some(l) if !l.is_empty() => {}
                            _ => leaderless += 1,
                        }
                    }
                }
            }
            Some((led, leaderless))
        })
    }

    /// Moves every stream and consumer leadership off node `i` (JetStream's leader stepdown
    /// requests, asked of another node), until `i` leads none of them; panics when that does not
    /// happen within 20 s. The meta group is not moved (that needs the system account): pick an
    /// `i` that does not lead it.
    pub fn evacuate(&mut self, i: usize) {
        self.evacuate_keeping(i, None);
    }

    /// `evacuate`, except that node `i` keeps leading the stream `keep` (not its consumers).
    pub fn evacuate_keeping(&mut self, i: usize, keep: Option<&str>) {
        let name = self.nodes[i].name.clone();
        let client = self.nodes[(i + 1) % 3].client;
        let mut last = Vec::new();
        let mut quiet_since: Option<std::time::Instant> = None;
        let done = poll(Duration::from_secs(20), || {
            let (mut led, leaderless) = self.led_by(&name)?;
            led.retain(|(s, c)| !(c.is_none() && Some(s.as_str()) == keep));
            // Done once the node leads nothing and every group has a leader, for 500 ms: a kill
            // during the elections the stepdowns started would be a kill during a failover.
            if led.is_empty() && leaderless == 0 {
                let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
                return (since.elapsed() >= Duration::from_millis(500)).then_some(());
            }
            quiet_since = None;
            for (stream, consumer) in &led {
                let subject = match consumer {
                    None => format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
                    Some(c) => format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{c}"),
                };
                let _ = nats_request(client, &subject);
            }
            last = led;
            None
        });
        assert!(done.is_some(), "{name} still leads {last:?}");
    }

    /// The node that leads the MQTT sessions stream `$MQTT_sess` and not the meta group (the
    /// stream's leadership is moved until that holds), with every other leadership moved off it:
    /// its death leaves the cluster unable to store a new session's record until the stream elects
    /// a new leader, so the other nodes close new connections before CONNACK meanwhile (issue 31),
    /// while deliveries go on.
    pub fn sessions_leader_only(&mut self) -> usize {
        let client = self.nodes[0].client;
        let mut asked: Option<std::time::Instant> = None;
        let found = poll(Duration::from_secs(20), || {
            let meta = self.meta_leader()?;
            let sess = self.leader("$MQTT_sess")?;
            if sess != meta {
                return Some(self.index_of(&sess));
            }
            // One stepdown a second: each starts an election that must end before the next.
            if asked.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                asked = Some(std::time::Instant::now());
                let _ = nats_request(client, "$JS.API.STREAM.LEADER.STEPDOWN.$MQTT_sess");
            }
            None
        });
        let victim = found.expect("a leader of $MQTT_sess that is not the meta leader");
        self.evacuate_keeping(victim, Some("$MQTT_sess"));
        victim
    }

    /// A node to kill later with `drain_and_kill`: `follower()`, or the next node when that one
    /// is the meta leader (which `evacuate` cannot move).
    pub fn victim(&mut self) -> usize {
        let meta = self.meta_leader();
        match self.follower() {
            v if Some(&self.nodes[v].name) == meta.as_ref() => (v + 1) % 3,
            v => v,
        }
    }

    /// Moves every stream and consumer leadership off node `i` (`evacuate`, as an operator drains
    /// a node; the consumers of the clients connected by now included), then SIGKILLs it. What
    /// its death costs is then mam's own failover, not a cluster's re-election. The kill's time.
    pub fn drain_and_kill(&mut self, i: usize) -> std::time::Instant {
        self.evacuate(i);
        assert_ne!(self.meta_leader().as_ref(), Some(&self.nodes[i].name), "the meta leader moved to the victim");
        self.nodes[i].kill();
        std::time::Instant::now()
    }

    pub fn index_of(&self, name: &str) -> usize {
        self.nodes.iter().position(|n| n.name == name).expect("a node of the cluster")
    }
}

/// True when an MQTT CONNECT to `addr` gets CONNACK 0 within `limit` (mam's own client).
pub fn mqtt_answers(addr: &str, limit: Duration) -> bool {
    let vars = [("MQTT_BROKER", addr.to_string()), ("MAM_MQTT_CONNECT_TIMEOUT_S", limit.as_secs().max(1).to_string())];
    let ctx = mam::ctx::Ctx::with_env(vars, std::path::Path::new("/"));
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    match mam::mqtt::Client::connect(&cfg, mam::mqtt::Role::Sub, &mam::mqtt::Stop::never()) {
        Ok(c) => {
            c.disconnect();
            true
        }
        Err(_) => false,
    }
}

/// One request over the core NATS protocol on loopback `port` (an empty payload), its reply or
/// `None` within 5 s: INFO, CONNECT, SUB to an inbox, PUB with that reply subject, then the MSG.
fn nats_request(port: u16, subject: &str) -> Option<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut w = s.try_clone().ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?; // INFO {...}
    let inbox = format!("_INBOX.mam.{}", rand_hex(4));
    write!(
        w,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"protocol\":1}}\r\nSUB {inbox} 1\r\nPUB {subject} {inbox} 0\r\n\r\n"
    )
    .ok()?;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line.starts_with("PING") {
            w.write_all(b"PONG\r\n").ok()?;
        } else if let Some(rest) = line.strip_prefix("MSG ") {
            let len: usize = rest.split_whitespace().last()?.parse().ok()?;
            let mut body = vec![0u8; len + 2];
            r.read_exact(&mut body).ok()?;
            body.truncate(len);
            return String::from_utf8(body).ok();
        } else if line.starts_with("-ERR") {
            return None;
        }
    }
}

/// A plain HTTP/1.0 GET on loopback, the body or `None`.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// Two mosquittos, the second bridged to the first for the whole `mam/#` tree in both directions.
pub struct Bridged {
    pub a: Mosquitto,
    pub b: Mosquitto,
}

impl Bridged {
    pub fn start(td: &TestDir) -> Option<Bridged> {
        if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
            return None;
        }
        let a = Mosquitto::start(td, crate::support::anonymous);
        let a_port = a.port;
        let b = Mosquitto::start(td, move |port| {
            format!(
                "{}connection to-a\naddress 127.0.0.1:{a_port}\ntopic mam/# both 1\ncleansession true\n\
                 restart_timeout 1\ntry_private true\n",
                crate::support::anonymous(port)
            )
        });
        let br = Bridged { a, b };
        wait_until("the bridge to carry a message", Duration::from_secs(15), || br.bridge_carries());
        Some(br)
    }

    pub fn list(&self, first_a: bool) -> String {
        let (x, y) = if first_a { (self.a.port, self.b.port) } else { (self.b.port, self.a.port) };
        format!("127.0.0.1:{x},127.0.0.1:{y}")
    }

    /// A message published on b reaches a subscriber on a (the bridge is up).
    fn bridge_carries(&self) -> bool {
        let topic = format!("mam/probe/{}", rand_hex(3));
        let sub = crate::support::MosqSub::start(self.a.port, &topic);
        let _ = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &self.b.port.to_string(), "-t", &topic, "-m", "x", "-q", "1"])
            .status();
        poll(Duration::from_secs(2), || (!sub.messages(&topic).is_empty()).then_some(())).is_some()
    }
}

/// One machine: its own control root and a broker list (nearest node first).
pub struct Machine {
    pub td: TestDir,
    pub brokers: String,
}

impl Machine {
    pub fn new(name: &str, brokers: String) -> Machine {
        Machine { td: TestDir::new(name), brokers }
    }

    pub fn mam(&self) -> Cmd {
        self.td
            .mam()
            .env("MQTT_BROKER", &self.brokers)
            .env("MAM_WATCH_POLL_MS", "100")
            .env("MAM_MQTT_CONNECT_TIMEOUT_S", CONNECT_S.to_string())
    }

    pub fn registry(&self) -> PathBuf {
        self.td.ws().join(".mam/jobs")
    }

    pub fn logs(&self) -> PathBuf {
        self.td.ws().join(".mam/delegate_job_logs")
    }

    /// Registers a job with N=`n` and K=`k`; its id.
    pub fn register(&self, n: u64, k: u64) -> String {
        let id = format!("m{}", rand_hex(4));
        let (n, k) = (n.to_string(), k.to_string());
        let args = ["registry", "register", "--session", "w1", "--job-id", &id, "--heartbeat-sec", &n];
        self.mam().args(args).args(["--heartbeat-misses", &k]).run().expect_rc(0);
        id
    }

    pub fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }

    /// The record of `id` as another machine's registry gets it (a copy), then re-pointed at this
    /// machine's own broker list.
    pub fn adopt(&self, from: &Machine, id: &str) {
        fs::create_dir_all(self.registry()).unwrap();
        let name = format!("{id}.json");
        fs::copy(from.registry().join(&name), self.registry().join(&name)).unwrap();
        let r = self.mam().args(["registry", "repoint", id, "--broker", &self.brokers]).run();
        r.expect_rc(0);
        assert!(r.stdout().contains(&format!("repointed 1 job(s) to {}", self.brokers)), "{}", r.stdout());
    }

    pub fn publish(&self, id: &str, event: &str, extra: &[&str]) -> crate::support::Run {
        self.mam().args(["publish", "--job-id", id, "--event", event]).args(extra).run()
    }

    pub fn watch(&self, id: &str) -> Background {
        let mut w = self.mam().args(["watch", "--job-id", id]).spawn_bg(&self.td, "watch");
        crate::watch::wait_lines(&mut w, "subscribed topic=", 2);
        w
    }

    pub fn events(&self, id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.registry().join(id).join("events.log")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// `(seq, event)` of the non-beat events of the job's events.log, in order.
    pub fn non_beats(&self, id: &str) -> Vec<(u64, String)> {
        self.events(id)
            .iter()
            .filter(|e| e["heartbeat"] != true)
            .map(|e| (e["seq"].as_u64().unwrap(), e["event"].as_str().unwrap().to_string()))
            .collect()
    }

    pub fn hb_log(&self, id: &str) -> String {
        fs::read_to_string(self.logs().join(id).join("heartbeat.log")).unwrap_or_default()
    }

    pub fn audit(&self, id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.logs().join(id).join("audit.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

/// `(seq, event, wall ms)` of every `accepted seq=` line of a watch's stdout, in order.
pub fn accepted(out: &str) -> Vec<(u64, String, u64)> {
    out.lines()
        .filter_map(|l| {
            let (ts, rest) = l.split_once(' ')?;
            let rest = rest.split_once(" accepted seq=")?.1;
            let (seq, ev) = rest.split_once(" event=")?;
            Some((seq.parse().ok()?, ev.to_string(), mam::clock::parse_ts(ts)?))
        })
        .collect()
}

/// The wall ms of every line of a watch's stdout that renewed its idle clock (CORE 8.3): an
/// accepted event, or an accepted state newer than every event and state before it.
pub fn evidence(out: &str) -> Vec<u64> {
    let (mut event_hw, mut state_hw) = (0u64, 0u64);
    let mut at = Vec::new();
    for l in out.lines() {
        let Some((ts, rest)) = l.split_once(' ') else { continue };
        let Some(ms) = mam::clock::parse_ts(ts) else { continue };
        let seq_of = |tail: &str| tail.split(' ').next().and_then(|s| s.parse::<u64>().ok());
        if let Some(seq) = rest.split_once(" accepted seq=").and_then(|(_, t)| seq_of(t)) {
            event_hw = event_hw.max(seq);
            at.push(ms);
        } else if let Some(seq) = rest.split_once(" accepted-state seq=").and_then(|(_, t)| seq_of(t)) {
            if seq > event_hw.max(state_hw) {
                at.push(ms);
            }
            state_hw = state_hw.max(seq);
        }
    }
    at
}

/// The longest time the watch went without evidence, between its first and last, in ms.
pub fn longest_gap(out: &str) -> u64 {
    evidence(out).windows(2).map(|w| w[1].saturating_sub(w[0])).max().unwrap_or(0)
}
