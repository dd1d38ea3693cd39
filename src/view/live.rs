//! The two helper threads of `mam ui` (issue 22): the pane lister, which asks each pane server of
//! the running sessions what agents it has and in what state (every `LIST_EVERY`, and at once when
//! the set of servers changes), and the bus reader, which holds one subscription to every job's
//! events and states so the screen knows whether the broker is there and redraws as soon as a job
//! reports. Both call `wake` after each finding; neither writes anything anywhere.
//!
//! The lister runs with MAM_NO_AUTOSTART=1 (it never starts a pane server). The bus reader
//! subscribes at QoS 0 (it acknowledges nothing a publisher could wait for) and retries a lost
//! connection every `RETRY_EVERY`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::mqtt::{Client, MqttConfig, Role, Stop};
use crate::session::reconcile::list_server_agents;
use crate::text::one_line;
use crate::view::world::{Bus, Panes};

/// How often the pane servers are listed.
pub const LIST_EVERY: Duration = Duration::from_secs(3);

/// How long the bus reader waits before it connects again.
pub const RETRY_EVERY: Duration = Duration::from_secs(5);

/// A wake-up for the screen's loop (it makes a descriptor readable).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// The running helpers; dropping it stops them.
pub struct Live {
    stop: Arc<AtomicBool>,
    targets: Option<Sender<Vec<(String, String)>>>,
    panes: Arc<Mutex<Panes>>,
    bus: Arc<Mutex<Bus>>,
    poke: Arc<AtomicBool>,
    lister: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
}

impl Live {
    /// Starts the lister, and the bus reader when `mqtt` is usable (else the bus state says why).
    pub fn start(ctx: &Ctx, mqtt: Result<MqttConfig, String>, wake: Wake) -> Live {
        let stop = Arc::new(AtomicBool::new(false));
        let panes = Arc::new(Mutex::new(Panes::new()));
        let poke = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut ctx = ctx.clone();
        ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
        let lister = {
            let (panes, wake, stop) = (panes.clone(), wake.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ui-panes".into())
                .spawn(move || list_loop(&ctx, rx, &panes, &wake, &stop))
                .ok()
        };
        let (bus, reader) = match mqtt {
            Err(why) => (Arc::new(Mutex::new(Bus::Unconfigured(why))), None),
            Ok(cfg) => {
                let bus = Arc::new(Mutex::new(Bus::Connecting(cfg.addr())));
                let (b, p, w, s) = (bus.clone(), poke.clone(), wake, stop.clone());
                let h = std::thread::Builder::new()
                    .name("ui-bus".into())
                    .spawn(move || bus_loop(&cfg, &b, &p, &w, &s))
                    .ok();
                (bus, h)
            }
        };
        Live { stop, targets: Some(tx), panes, bus, poke, lister, reader }
    }

    /// The pane servers to list from now on (listed at once).
    pub fn set_targets(&self, targets: Vec<(String, String)>) {
        if let Some(tx) = &self.targets {
            let _ = tx.send(targets);
        }
    }

    pub fn panes(&self) -> Panes {
        self.panes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn bus(&self) -> Bus {
        self.bus.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// True once after a message arrived on the bus.
    pub fn take_poke(&self) -> bool {
        self.poke.swap(false, Ordering::SeqCst)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.targets = None; // ends the lister's wait
        if let Some(h) = self.lister.take() {
            let _ = h.join();
        }
        // The reader sees the flag within one 200 ms read slice; a TCP connect in progress is
        // bounded by the connect budget, which a person quitting should not wait for: it is left
        // to end with the process after a short grace.
        if let Some(h) = self.reader.take() {
            let until = Instant::now() + Duration::from_millis(600);
            while !h.is_finished() && Instant::now() < until {
                crate::sys::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

fn list_loop(ctx: &Ctx, rx: Receiver<Vec<(String, String)>>, panes: &Mutex<Panes>, wake: &Wake, stop: &AtomicBool) {
    let mut targets: Vec<(String, String)> = Vec::new();
    loop {
        match rx.recv_timeout(LIST_EVERY) {
            Ok(t) => targets = t,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(t) = rx.try_recv() {
            targets = t;
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut found = Panes::new();
        for (b, s) in &targets {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            found.insert((b.clone(), s.clone()), list_server_agents(ctx, b, s));
        }
        let changed = {
            let mut p = panes.lock().unwrap_or_else(|e| e.into_inner());
            let changed = *p != found;
            *p = found;
            changed
        };
        if changed {
            wake();
        }
    }
}

fn set(bus: &Mutex<Bus>, v: Bus, wake: &Wake) {
    let mut b = bus.lock().unwrap_or_else(|e| e.into_inner());
    if *b != v {
        *b = v;
        drop(b);
        wake();
    }
}

fn bus_loop(cfg: &MqttConfig, bus: &Mutex<Bus>, poke: &AtomicBool, wake: &Wake, stop: &Arc<AtomicBool>) {
    let addr = cfg.addr();
    let filters = [format!("{}/jobs/+/events", cfg.topic_root), format!("{}/jobs/+/state", cfg.topic_root)];
    let halt = Stop::flag(stop.clone());
    while !stop.load(Ordering::SeqCst) {
        let result = Client::connect(cfg, Role::Sub, &halt).and_then(|mut c| {
            c.subscribe(&filters, 0)?;
            set(bus, Bus::Connected(addr.clone()), wake);
            loop {
                if stop.load(Ordering::SeqCst) {
                    c.disconnect();
                    return Ok(());
                }
                if c.recv(Instant::now() + Duration::from_millis(200))?.is_some() && !poke.swap(true, Ordering::SeqCst)
                {
                    wake();
                }
            }
        });
        if let Err(e) = result {
            set(bus, Bus::Down(addr.clone(), one_line(&e.to_string())), wake);
        }
        let until = Instant::now() + RETRY_EVERY;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            crate::sys::sleep(Duration::from_millis(200));
        }
    }
}

/// One listing of `targets` now, on the calling thread (`mam ui --snapshot`).
pub fn list_once(ctx: &Ctx, targets: &[(String, String)]) -> Panes {
    let mut ctx = ctx.clone();
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    crate::sort::ordered::<BTreeMap<_, _>, _>(
        targets.iter().map(|(b, s)| ((b.clone(), s.clone()), list_server_agents(&ctx, b, s))),
    )
}

/// One connection attempt now (`mam ui --snapshot`): the bus state it finds.
pub fn bus_once(mqtt: Result<MqttConfig, String>) -> Bus {
    match mqtt {
        Err(why) => Bus::Unconfigured(why),
        Ok(cfg) => match Client::connect(&cfg, Role::Sub, &Stop::never()) {
            Ok(c) => {
                c.disconnect();
                Bus::Connected(cfg.addr())
            }
            Err(e) => Bus::Down(cfg.addr(), one_line(&e.to_string())),
        },
    }
}
