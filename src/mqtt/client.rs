//! One MQTT connection (CORE 3.2) and the persistent connection of CORE 3.5.
//!
//! Every wait has a deadline and reads in slices of at most 200 ms so the caller's `Stop` is seen.
//! Timeouts name their phase (connect, connack, puback, suback, pingresp). Incoming QoS 1 messages
//! are acknowledged as they are read, also while waiting for an acknowledgement of our own. The
//! client never prints; the password leaves this process only inside CONNECT.

use std::time::{Duration, Instant};

use super::codec::Incoming;
use super::codec::{self, Decoder, Frame, Inbox, Keepalive, KeepaliveAction, Message, PidGen};
use super::config::{self, Identity, MqttConfig, Role};
use super::error::MqttError;
use super::stop::Stop;
use super::transport::Transport;

/// Longest single blocking read, so stop flags are honoured (CORE 3.2).
pub const READ_SLICE: Duration = Duration::from_millis(200);

/// How long `subscribe_each` waits before asking again for a refused filter.
pub const REFUSED_PAUSE: Duration = Duration::from_millis(500);

/// After a reconnect, a filter the broker granted before is asked again for this many connect
/// timeouts (a first subscription for one): a refusal now is a cluster's failover, not a rule.
/// NATS 2.9 keeps a crashed node in new consumers' groups for tens of seconds (docs/CLUSTER.md).
pub const RESUBSCRIBE_PATIENCE: u32 = 3;

/// The pause before a connect walks a broker list again within its deadline (issue 31).
pub const REWALK_PAUSE: Duration = Duration::from_millis(250);

/// A connected MQTT session.
pub struct Client {
    t: Transport,
    addr: String,
    dec: Decoder,
    ka: Keepalive,
    pids: PidGen,
    inbox: Inbox,
    budget: Duration,
    stop: Stop,
    client_id: String,
    closed: bool,
}

/// Whether a broker of `cfg` takes a connection within `within` (at most the configured connect
/// timeout): CONNECT, CONNACK, DISCONNECT. Issue 32: `mam create` says so when none does.
pub fn probe(cfg: &MqttConfig, within: Duration) -> Result<(), MqttError> {
    let cfg = MqttConfig { connect_timeout: cfg.connect_timeout.min(within), ..cfg.clone() };
    Client::connect(&cfg, Role::Chk, &Stop::signals())?.disconnect();
    Ok(())
}

impl Client {
    /// Connects with a fresh client id for `role`.
    pub fn connect(cfg: &MqttConfig, role: Role, stop: &Stop) -> Result<Client, MqttError> {
        let id = config::client_id(role).map_err(|e| MqttError::Internal(format!("random client id: {e}")))?;
        Client::connect_with_id(cfg, &id, stop)
    }

    /// TCP (or the TLS shim), CONNECT and CONNACK under one deadline of `cfg.connect_timeout`,
    /// walking the broker list from its first entry.
    pub fn connect_with_id(cfg: &MqttConfig, client_id: &str, stop: &Stop) -> Result<Client, MqttError> {
        Client::connect_from(cfg, client_id, stop, 0).map(|(c, _)| c)
    }

    /// Walks `cfg.brokers` from index `first` (wrapping around), each broker within an equal share
    /// of what is left of the one connect deadline (the last one gets all of it), and moves on
    /// after any failure but a stop or a missing openssl (issue 19). Returns the client and the
    /// index of the broker that answered. With one broker the error is that broker's; with more it
    /// is `NoBroker`, naming each.
    ///
    /// When a walk ends early and some broker of it was up but not ready (`not_ready`: it closed
    /// the connection before CONNACK, or answered CONNACK 3), the list is walked again,
    /// `REWALK_PAUSE` later, until the deadline (issue 31): a NATS node whose cluster just lost a
    /// peer closes a new session's connection while its JetStream session lookup fails, and
    /// answers a moment later. A list of dead nodes (refused, unresolvable) fails at once as before.
    pub fn connect_from(
        cfg: &MqttConfig,
        client_id: &str,
        stop: &Stop,
        first: usize,
    ) -> Result<(Client, usize), MqttError> {
        let deadline = Instant::now() + cfg.connect_timeout;
        let n = cfg.brokers.len();
        loop {
            let mut failures = Vec::new();
            for k in 0..n {
                let i = (first + k) % n;
                let ep = &cfg.brokers[i];
                let now = Instant::now();
                if now >= deadline {
                    failures.push((ep.addr(), MqttError::NoConnack { addr: ep.addr(), phase: "connect (not tried)" }));
                    continue;
                }
                let share = if k + 1 == n { deadline } else { now + (deadline - now) / (n - k) as u32 };
                match Client::connect_one(cfg, ep, client_id, stop, share) {
                    Ok(c) => return Ok((c, i)),
                    Err(e) if n == 1 || !e.moves_on() => return Err(e),
                    Err(e) => failures.push((ep.addr(), e)),
                }
                if stop.is_set() {
                    return Err(MqttError::Stopped);
                }
            }
            let again = failures.iter().any(|(_, e)| e.not_ready());
            if !again || !sliced_pause(REWALK_PAUSE, deadline, stop) {
                return Err(MqttError::NoBroker { failures });
            }
        }
    }

    /// One broker of the list, before `deadline`.
    fn connect_one(
        cfg: &MqttConfig,
        ep: &config::Endpoint,
        client_id: &str,
        stop: &Stop,
        deadline: Instant,
    ) -> Result<Client, MqttError> {
        let addr = ep.addr();
        let t = Transport::open(cfg, ep, deadline)?;
        let mut c = Client {
            t,
            addr: addr.clone(),
            dec: Decoder::new(),
            ka: Keepalive::new(cfg.keepalive_s, Instant::now()),
            pids: PidGen::default(),
            inbox: Inbox::new(),
            budget: cfg.connect_timeout,
            stop: stop.clone(),
            client_id: client_id.to_string(),
            closed: false,
        };
        let pkt = codec::connect(
            client_id,
            cfg.keepalive_s,
            cfg.username.as_deref(),
            cfg.password.as_ref().map(config::Secret::expose),
        );
        let result = c.send(&pkt, "connect").and_then(|_| c.wait_connack(deadline));
        match result {
            Ok(()) => Ok(c),
            Err(e) => {
                let e = c.before_connack(e);
                c.closed = true;
                c.t.close();
                Err(e)
            }
        }
    }

    fn wait_connack(&mut self, deadline: Instant) -> Result<(), MqttError> {
        match self.pump(deadline, "connect", false)? {
            None => Err(MqttError::NoConnack { addr: self.addr.clone(), phase: "connack" }),
            Some(Frame::Connack { code: 0 }) => Ok(()),
            Some(Frame::Connack { code }) => Err(MqttError::ConnackRefused { addr: self.addr.clone(), code }),
            Some(other) => Err(MqttError::Protocol {
                addr: self.addr.clone(),
                detail: format!("expected CONNACK, got {}", frame_name(&other)),
            }),
        }
    }

    /// Turns "connection lost" before CONNACK into the specific error: a TLS verification failure or
    /// early shim exit when the shim is in use, else "closed before CONNACK".
    fn before_connack(&mut self, e: MqttError) -> MqttError {
        if !matches!(e, MqttError::Lost { .. }) {
            return e;
        }
        let addr = self.addr.clone();
        match self.t.shim() {
            Some(shim) => match shim.failure_detail(Duration::from_secs(1)) {
                (Some(line), _) => MqttError::TlsVerify { addr, line },
                (None, last) => MqttError::TlsExited { addr, detail: last.unwrap_or_else(|| "no diagnostics".into()) },
            },
            None => MqttError::ClosedBeforeConnack { addr },
        }
    }

    /// The client id sent in CONNECT.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// `host:port` of the broker.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn send(&mut self, bytes: &[u8], during: &'static str) -> Result<(), MqttError> {
        match self.t.write_all(bytes, self.budget) {
            Ok(()) => {
                self.ka.on_sent(Instant::now());
                Ok(())
            }
            Err(e) => Err(MqttError::Lost { addr: self.addr.clone(), during, detail: e.to_string() }),
        }
    }

    /// Reads until a frame the caller must see arrives (`Some`) or `deadline` passes (`None`).
    /// Incoming publishes are acknowledged and queued, PINGRESPs absorbed, keepalive served when
    /// `session` (after CONNACK).
    fn pump(&mut self, deadline: Instant, during: &'static str, session: bool) -> Result<Option<Frame>, MqttError> {
        self.pump_until(deadline, during, session, false)
    }

    /// `pump`, also returning `None` as soon as a publish is queued when `for_publish`.
    fn pump_until(
        &mut self,
        deadline: Instant,
        during: &'static str,
        session: bool,
        for_publish: bool,
    ) -> Result<Option<Frame>, MqttError> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            while let Some(f) = self.dec.next_frame().map_err(|e| self.protocol(e.to_string()))? {
                if let Some(f) = self.absorb(f, session)? {
                    return Ok(Some(f));
                }
            }
            if for_publish && !self.inbox.is_empty() {
                return Ok(None);
            }
            if self.stop.is_set() {
                return Err(MqttError::Stopped);
            }
            let now = Instant::now();
            if session {
                match self.ka.poll(now) {
                    KeepaliveAction::Nothing => {}
                    KeepaliveAction::SendPing => self.send(&codec::pingreq(), "keepalive")?,
                    KeepaliveAction::Lost => {
                        return Err(MqttError::Timeout {
                            addr: self.addr.clone(),
                            phase: "pingresp",
                            what: format!("sent no PINGRESP within {:?}; connection lost", self.ka.half()),
                        })
                    }
                }
            }
            if now >= deadline {
                return Ok(None);
            }
            let mut slice = READ_SLICE.min(deadline - now);
            if session {
                slice = slice.min(self.ka.next_due().saturating_duration_since(now));
            }
            match self.t.read_timeout(&mut buf, slice) {
                Ok(None) => {}
                Ok(Some(0)) => {
                    return Err(MqttError::Lost {
                        addr: self.addr.clone(),
                        during,
                        detail: "closed by the broker".into(),
                    })
                }
                Ok(Some(n)) => self.dec.push(&buf[..n]),
                Err(e) => return Err(MqttError::Lost { addr: self.addr.clone(), during, detail: e.to_string() }),
            }
        }
    }

    /// Handles frames nobody waits for; returns the others.
    fn absorb(&mut self, f: Frame, session: bool) -> Result<Option<Frame>, MqttError> {
        if !session {
            return Ok(Some(f));
        }
        match f {
            Frame::Publish(m) => {
                match (m.qos, m.pid) {
                    (1, Some(pid)) => self.send(&codec::puback(pid), "acknowledge")?,
                    // QoS 2 is never requested; if a broker sends it anyway, complete the handshake.
                    (2, Some(pid)) => self.send(&codec::pubrec(pid), "acknowledge")?,
                    _ => {}
                }
                self.inbox.push_back(m);
                Ok(None)
            }
            Frame::Pubrel(pid) => {
                self.send(&codec::pubcomp(pid), "acknowledge")?;
                Ok(None)
            }
            Frame::Pingresp => {
                self.ka.on_pingresp();
                Ok(None)
            }
            Frame::Unexpected(what) => Err(self.protocol(format!("unexpected {what} from broker"))),
            Frame::Connack { .. } => Err(self.protocol("second CONNACK".into())),
            other => Ok(Some(other)),
        }
    }

    fn protocol(&self, detail: String) -> MqttError {
        MqttError::Protocol { addr: self.addr.clone(), detail }
    }

    /// Publishes one message; QoS 1 waits for the matching PUBACK within the budget.
    pub fn publish(&mut self, msg: &Message) -> Result<(), MqttError> {
        let pid = if msg.qos == 1 { self.pids.next_pid() } else { 0 };
        let bytes = codec::publish(msg, pid).map_err(|err| MqttError::Encode { topic: msg.topic.clone(), err })?;
        self.send(&bytes, "publish")?;
        if msg.qos == 0 {
            return Ok(());
        }
        let deadline = Instant::now() + self.budget;
        loop {
            match self.pump(deadline, "publish", true)? {
                None => {
                    return Err(MqttError::Timeout {
                        addr: self.addr.clone(),
                        phase: "puback",
                        what: format!(
                            "sent no PUBACK for '{}' within {}s",
                            crate::text::one_line(&msg.topic),
                            self.budget.as_secs()
                        ),
                    })
                }
                Some(Frame::Puback(p)) if p == pid => return Ok(()),
                Some(_) => {} // a late ack of an earlier attempt, or an unsolicited ack
            }
        }
    }

    /// Publishes `msgs` in order over this connection, each after the previous was acknowledged.
    pub fn publish_raw(&mut self, msgs: &[Message]) -> Result<(), MqttError> {
        for m in msgs {
            self.publish(m)?;
        }
        Ok(())
    }

    /// Subscribes to `filters` at `qos` (CORE 3.2: QoS 1) and checks the SUBACK; returns the
    /// granted QoS per filter. A 0x80 result is a non-retryable error naming the filter.
    pub fn subscribe(&mut self, filters: &[String], qos: u8) -> Result<Vec<u8>, MqttError> {
        let pid = self.pids.next_pid();
        let bytes =
            codec::subscribe(pid, filters, qos).map_err(|err| MqttError::Encode { topic: filters.join(" "), err })?;
        self.send(&bytes, "subscribe")?;
        let deadline = Instant::now() + self.budget;
        loop {
            match self.pump(deadline, "subscribe", true)? {
                None => {
                    return Err(MqttError::Timeout {
                        addr: self.addr.clone(),
                        phase: "suback",
                        what: format!(
                            "sent no SUBACK for '{}' within {}s",
                            crate::text::one_line(&filters.join(" ")),
                            self.budget.as_secs()
                        ),
                    })
                }
                Some(Frame::Suback { pid: p, codes }) if p == pid => {
                    if let Some(i) = codes.iter().position(|&c| c == 0x80) {
                        let filter = filters.get(i).cloned().unwrap_or_default();
                        return Err(MqttError::SubackRefused { filter });
                    }
                    if codes.len() != filters.len() {
                        return Err(self.protocol(format!("SUBACK has {} codes for {}", codes.len(), filters.len())));
                    }
                    return Ok(codes);
                }
                Some(_) => {}
            }
        }
    }

    /// `subscribe` for a long-lived subscriber (issue 19): one SUBSCRIBE per filter, each with its
    /// own acknowledgement budget, and a filter refused (0x80) asked again on this connection,
    /// `REFUSED_PAUSE` apart, until `patience` has passed since it was first asked. NATS 2.9's MQTT
    /// gateway refuses a QoS 1 filter whose JetStream consumer it could not make within its own
    /// 4 s (while a peer of the cluster is dead, half of them), yet goes on making it; the same
    /// session asking again gets it, where a new connection would start over with new consumers.
    /// Deliveries arriving meanwhile are queued, not lost. The error is the last refusal.
    pub fn subscribe_each(&mut self, filters: &[String], qos: u8, patience: Duration) -> Result<Vec<u8>, MqttError> {
        let mut granted = Vec::with_capacity(filters.len());
        for f in filters {
            let until = Instant::now() + patience;
            loop {
                match self.subscribe(std::slice::from_ref(f), qos) {
                    Ok(g) => {
                        granted.extend(g);
                        break;
                    }
                    Err(MqttError::SubackRefused { .. }) if Instant::now() + REFUSED_PAUSE < until => {
                        self.service(Instant::now() + REFUSED_PAUSE)?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(granted)
    }

    /// The next incoming publish before `deadline` (`None` when it passes); serves keepalive.
    pub fn recv(&mut self, deadline: Instant) -> Result<Option<Incoming>, MqttError> {
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return Ok(Some(m));
            }
            // Frames returned here are stray acknowledgements; publishes land in the inbox.
            if self.pump_until(deadline, "receive", true, true)?.is_none() {
                return Ok(self.inbox.pop_front());
            }
        }
    }

    /// Serves the connection (keepalive, acknowledgements) until `deadline`, queueing publishes.
    pub fn service(&mut self, deadline: Instant) -> Result<(), MqttError> {
        while self.pump(deadline, "idle", true)?.is_some() {}
        Ok(())
    }

    /// True when the broker has closed the connection (non-blocking).
    pub fn peer_closed(&mut self) -> bool {
        self.t.peer_closed()
    }

    /// DISCONNECT, then shut the socket down or end the shim.
    pub fn disconnect(mut self) {
        self.close();
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let _ = self.t.write_all(&codec::disconnect(), Duration::from_millis(500));
        self.t.close();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits `pause` in `READ_SLICE` slices; false (without waiting) when the pause would end at or
/// after `deadline`, or when `stop` is set meanwhile.
fn sliced_pause(pause: Duration, deadline: Instant, stop: &Stop) -> bool {
    let until = Instant::now() + pause;
    if until >= deadline {
        return false;
    }
    loop {
        if stop.is_set() {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        crate::sys::sleep((until - now).min(READ_SLICE));
    }
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Connack { .. } => "CONNACK",
        Frame::Publish(_) => "PUBLISH",
        Frame::Puback(_) => "PUBACK",
        Frame::Pubrec(_) => "PUBREC",
        Frame::Pubrel(_) => "PUBREL",
        Frame::Pubcomp(_) => "PUBCOMP",
        Frame::Suback { .. } => "SUBACK",
        Frame::Unsuback(_) => "UNSUBACK",
        Frame::Pingresp => "PINGRESP",
        Frame::Unexpected(w) => w,
    }
}

/// The one connection a long-running role keeps (CORE 3.5). It connects lazily, is reused only for
/// publishes whose identity equals its frozen identity, and after a drop the next operation fails
/// with `not connected` (retryable) and the one after reconnects.
pub struct Persistent {
    cfg: MqttConfig,
    identity: Identity,
    role: Role,
    stop: Stop,
    client: Option<Client>,
    connects: u32,
    /// Filters re-subscribed after every (re)connect, with their QoS.
    subscriptions: Vec<(Vec<String>, u8)>,
    /// Where the next connect starts in the broker list: the broker that answered last, or the one
    /// after it once its connection was lost (issue 19: a dead node is not dialled first).
    next_first: usize,
    /// The index of the broker the kept connection is to.
    current: usize,
    /// The client id of every connection, when the caller fixed one (`mam sub -i`); else a fresh
    /// random id per connection.
    fixed_id: Option<String>,
    /// `host:port` of the broker whose connection was lost, and why, until the next connect.
    lost_from: Option<(String, String)>,
    /// Said once by `take_move` after a reconnect: the broker lost, why, and the broker now used.
    moved: Option<Moved>,
    /// A second connection, to another broker of the list, kept ready by `keep_standby` and used
    /// when the kept one is lost (issue 31), with that broker's index.
    standby: Option<(Client, usize)>,
    /// When `keep_standby` last tried to open one.
    standby_tried: Option<Instant>,
}

/// How often `keep_standby` tries again to open a standby connection after a failed try.
pub const STANDBY_RETRY: Duration = Duration::from_secs(5);

/// A persistent connection that was lost and made again (issue 31), for the caller's one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub from: String,
    pub why: String,
    pub to: String,
}

impl Moved {
    /// `connection to A lost (why); now connected to B` (or `reconnected to A` when it is the same).
    pub fn describe(&self) -> String {
        if self.from == self.to {
            format!("connection to {} lost ({}); reconnected to it", self.from, self.why)
        } else {
            format!("connection to {} lost ({}); now connected to {}", self.from, self.why, self.to)
        }
    }
}

impl Persistent {
    /// Freezes `cfg`'s identity; no connection is made yet.
    pub fn new(cfg: MqttConfig, role: Role, stop: Stop) -> Persistent {
        let identity = cfg.identity();
        Persistent {
            cfg,
            identity,
            role,
            stop,
            client: None,
            connects: 0,
            subscriptions: Vec::new(),
            next_first: 0,
            current: 0,
            fixed_id: None,
            lost_from: None,
            moved: None,
            standby: None,
            standby_tried: None,
        }
    }

    /// Keeps a standby connection to another broker of the list (issue 31), for a publisher whose
    /// next message must not wait for a new session after its broker dies: a NATS cluster whose
    /// node leading the sessions stream died closes or stalls every new session's CONNECT until
    /// the stream has a new leader (4-9 s of raft election), while a session made before goes on
    /// publishing. Serves the standby's keepalive; when there is none (and the kept connection is
    /// up, the list has two or more brokers, and `STANDBY_RETRY` passed since the last try), opens
    /// one to the first other broker that answers, within the connect deadline or until `stop`.
    /// Subscriptions are not made on it (it would receive every message twice); they are made
    /// when it takes over. Returns the error of a failed try.
    pub fn keep_standby(&mut self, stop: &Stop) -> Result<(), MqttError> {
        if let Some((c, _)) = self.standby.as_mut() {
            if c.peer_closed() || c.service(Instant::now() + Duration::from_millis(5)).is_err() {
                self.standby = None;
            }
        }
        let n = self.cfg.brokers.len();
        if self.standby.is_some() || self.client.is_none() || n < 2 {
            return Ok(());
        }
        if self.standby_tried.is_some_and(|t| t.elapsed() < STANDBY_RETRY) {
            return Ok(());
        }
        self.standby_tried = Some(Instant::now());
        let mut others = self.cfg.clone();
        others.brokers.remove(self.current);
        let id = self.next_client_id()?;
        let first = self.current % others.brokers.len();
        let (c, j) = Client::connect_from(&others, &id, stop, first)?;
        let i = if j >= self.current { j + 1 } else { j };
        self.standby = Some((c, i));
        Ok(())
    }

    /// `host:port` of the standby connection's broker, if there is one.
    pub fn standby_to(&self) -> Option<&str> {
        self.standby.as_ref().map(|(c, _)| c.addr())
    }

    fn next_client_id(&self) -> Result<String, MqttError> {
        match &self.fixed_id {
            Some(id) => Ok(id.clone()),
            None => config::client_id(self.role).map_err(|e| MqttError::Internal(format!("random client id: {e}"))),
        }
    }

    /// Every connection with `id` as its client id instead of a fresh random one.
    pub fn with_client_id(mut self, id: String) -> Persistent {
        self.fixed_id = Some(id);
        self
    }

    /// The last reconnect after a lost connection, once: which broker was lost, why, and which
    /// one answered instead (issue 31: long-lived clients say one line when they move).
    pub fn take_move(&mut self) -> Option<Moved> {
        self.moved.take()
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// How many connections this object has opened (for tests and diagnostics).
    pub fn connects(&self) -> u32 {
        self.connects
    }

    pub fn is_connected(&self) -> bool {
        self.client.is_some()
    }

    /// `NOTE: connection identity differs (<field>); using a separate connection` when `cfg` may not
    /// reuse this connection, naming the field only.
    pub fn identity_note(&self, cfg: &MqttConfig) -> Option<String> {
        self.identity
            .differs(&cfg.identity())
            .map(|field| format!("NOTE: connection identity differs ({field}); using a separate connection"))
    }

    /// The live client, connecting when there is none. A connection found closed by the broker is
    /// discarded and reported as `not connected`; the next call reconnects.
    pub fn client(&mut self) -> Result<&mut Client, MqttError> {
        if let Some(c) = self.client.as_mut() {
            if c.peer_closed() {
                let addr = c.addr().to_string();
                self.client = None;
                self.lost_from = Some((addr.clone(), "closed by the broker".into()));
                self.lost();
                return Err(MqttError::NotConnected { addr });
            }
        }
        if self.client.is_none() {
            let ready = self.standby.take().and_then(|(mut c, i)| (!c.peer_closed()).then_some((c, i)));
            let (mut c, i) = match ready {
                Some(ready) => ready,
                None => {
                    let id = self.next_client_id()?;
                    Client::connect_from(&self.cfg, &id, &self.stop, self.next_first)?
                }
            };
            self.current = i;
            self.next_first = i;
            for (filters, qos) in &self.subscriptions {
                if let Err(e) = c.subscribe_each(filters, *qos, self.cfg.connect_timeout * RESUBSCRIBE_PATIENCE) {
                    self.lost();
                    return Err(e);
                }
            }
            self.connects += 1;
            if let Some((from, why)) = self.lost_from.take() {
                self.moved = Some(Moved { from, why, to: c.addr().to_string() });
            }
            self.client = Some(c);
        }
        self.client.as_mut().ok_or_else(|| MqttError::Internal("no client".into()))
    }

    /// Runs `op` on the kept connection; a wire failure discards the connection so the next
    /// operation reconnects.
    pub fn with_client<T>(&mut self, op: impl FnOnce(&mut Client) -> Result<T, MqttError>) -> Result<T, MqttError> {
        let c = self.client()?;
        let r = op(c);
        if let Err(e) = &r {
            if !matches!(e, MqttError::Encode { .. } | MqttError::SubackRefused { .. } | MqttError::Stopped) {
                if let Some(addr) = self.connected_to() {
                    self.lost_from = Some((addr.to_string(), e.to_string()));
                }
                self.drop_connection();
                self.lost();
            }
        }
        r
    }

    /// Publishes `msgs` for `cfg`: over the kept connection when the identities match, else over a
    /// one-shot connection (the caller prints `identity_note`).
    pub fn publish(&mut self, cfg: &MqttConfig, msgs: &[Message]) -> Result<(), MqttError> {
        if self.identity.differs(&cfg.identity()).is_some() {
            let mut c = Client::connect(cfg, self.role, &self.stop)?;
            c.publish_raw(msgs)?;
            c.disconnect();
            return Ok(());
        }
        self.with_client(|c| c.publish_raw(msgs))
    }

    /// Subscribes on the kept connection (connecting if needed; `Client::subscribe_each`, patient
    /// for one connect timeout per filter) and remembers the filters, so every later reconnect
    /// subscribes again before it is used.
    pub fn subscribe(&mut self, filters: &[String], qos: u8) -> Result<Vec<u8>, MqttError> {
        let patience = self.cfg.connect_timeout;
        let granted = self.with_client(|c| c.subscribe_each(filters, qos, patience))?;
        self.subscriptions.push((filters.to_vec(), qos));
        Ok(granted)
    }

    /// `subscribe` with a single SUBSCRIBE whose refusal is final (`Client::subscribe`), as a
    /// one-off subscriber such as `mam sub` asks the first time; the filters are remembered and
    /// subscribed again, patiently, after every reconnect.
    pub fn subscribe_once(&mut self, filters: &[String], qos: u8) -> Result<Vec<u8>, MqttError> {
        let granted = self.with_client(|c| c.subscribe(filters, qos))?;
        self.subscriptions.push((filters.to_vec(), qos));
        Ok(granted)
    }

    /// The next message on the kept connection before `deadline` (reconnecting and re-subscribing
    /// first when the connection was dropped).
    pub fn recv(&mut self, deadline: Instant) -> Result<Option<Incoming>, MqttError> {
        self.with_client(|c| c.recv(deadline))
    }

    /// Serves keepalive on the kept connection until `deadline` (no-op when not connected).
    pub fn service(&mut self, deadline: Instant) -> Result<(), MqttError> {
        if self.client.is_none() {
            return Ok(());
        }
        self.with_client(|c| c.service(deadline))
    }

    /// Closes the kept connection with DISCONNECT.
    pub fn drop_connection(&mut self) {
        if let Some(c) = self.client.take() {
            c.disconnect();
        }
    }

    /// The kept connection's broker failed: the next connect starts after it in the list.
    fn lost(&mut self) {
        self.next_first = (self.current + 1) % self.cfg.brokers.len().max(1);
    }

    /// `host:port` of the broker the kept connection is to, if connected.
    pub fn connected_to(&self) -> Option<&str> {
        self.client.as_ref().map(Client::addr)
    }
}
