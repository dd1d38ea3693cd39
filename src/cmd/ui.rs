//! `mam ui` (issue 22): one live full-screen view of every agent session, job and loop of the
//! control root, with keys to go to an agent's pane (`mam attach`'s plan), read a job's report,
//! follow its events.log, stop a session or cancel a job (through `mam stop` and `mam registry
//! status --set cancelled`, after a confirmation), filter, and a key help.
//!
//! The loop: epoll over the terminal's input, a signal self-pipe (SIGWINCH redraws at the new
//! size; SIGTERM, SIGINT and SIGHUP quit) and a waker the helper threads (`view::live`) use; the
//! files are looked at 4 times a second (`view::scan`: stats, and reads only of what changed) and
//! the screen is redrawn by changed lines only (`ui::screen`). The terminal is restored on every
//! way out (`ui::term`). When stdout or stdin is not a terminal it is `mam jobs --follow`.
//!
//! It writes nothing itself: the only changes are the commands a person would run, run as
//! children when the person confirms.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::attach::{self, Here};
use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::cmd::attach as attach_cmd;
use crate::cmd::jobs;
use crate::ctx::{ChildRole, Ctx};
use crate::joblog::{self, Waiting};
use crate::mqtt::MqttConfig;
use crate::paths;
use crate::sys::{self, Epoll, EpollEvents, SignalPipe, Waker, EPOLL_IN};
use crate::text::{self, one_line};
use crate::ui::app::{items, Action, App, Item, Mode, Pager, StopWhat};
use crate::ui::draw::{draw, plain};
use crate::ui::keys::decode;
use crate::ui::pages;
use crate::ui::screen::Screen;
use crate::ui::term::Term;
use crate::view::live::{self, Live};
use crate::view::scan::{self, Watch};
use crate::view::world::{self, Bus, Panes, World};

pub const USAGE: &str = "
Usage: mam ui [--registry-dir D] [--snapshot COLSxROWS]

A full-screen view, redrawn as evidence arrives, of the control root's
  sessions: name, agent, backend:server and pane, agent state (`mam status`'s STATE words, see
            its --help: working, idle, done, gone, unknown; waiting: blocked on a question for
            you; stopped: the row of a stopped session; remote: a remote runner's session;
            ...: the pane server has not answered yet), the open job and its age;
  jobs:     id, status, session, elapsed, the age of the last evidence against the idle window
            (a bar that fills as it runs out), the last heartbeat, the verdict; finished jobs are
            dim, a silent one is red with how long it has been silent; an open job whose agent
            waits for a person (an approval dialog, or back at its input line) says `waiting for
            you: ...` in yellow, and its session's state is `waiting`;
  loops:    state, phase, round, each reviewer's verdict, what was promoted;
and a footer with the broker (connected or not) and the registry.

Keys: up/down or j/k move; Enter goes to the selected session's pane (inside tmux a switch or a
new window, outside an attach, on herdr its focus; leave it as usual to come back here); r the
job's report; l its events.log, followed; s stops the session or cancels the job (asks first);
/ filters; ? lists the keys; q or Ctrl-C quits.

It reads files and the bus only; it changes nothing except through `mam stop` and `mam registry
status --set cancelled`, run when you confirm. When stdout or stdin is not a terminal it prints
the plain `mam jobs --follow` table instead.

Options:
  --registry-dir D        the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                          <control root>/.mam/jobs
  --snapshot COLSxROWS    print one screen of that size as plain text and exit
  -h, --help              print this help

Exit codes: 0 quit (q, Ctrl-C, SIGTERM, SIGHUP), 1 registry missing or the terminal unusable,
2 usage.
";

/// How often the files are looked at.
const TICK: Duration = Duration::from_millis(250);
/// How long a message stays in the footer.
const SAY_MS: u64 = 8_000;

#[derive(Debug, Default)]
struct Args {
    registry_dir: Option<PathBuf>,
    snapshot: Option<(usize, usize)>,
}

fn parse_size(v: &str) -> Option<(usize, usize)> {
    let (c, r) = v.split_once('x')?;
    let c: usize = c.parse().ok().filter(|c| (10..=1000).contains(c))?;
    let r: usize = r.parse().ok().filter(|r| (3..=1000).contains(r))?;
    Some((c, r))
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Long("snapshot") => {
                let v = cli::utf8("--snapshot", p.value()?)?;
                a.snapshot = Some(parse_size(&v).ok_or_else(|| {
                    Failure::usage(format!(
                        "ui: --snapshot {}: expected COLSxROWS (10-1000 x 3-1000), e.g. 80x24",
                        one_line(&v)
                    ))
                })?);
            }
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(a))
}

/// What the screen reads, kept between polls.
struct State {
    jobs: scan::Jobs,
    sessions: scan::SessionsFile,
    loops: scan::Loops,
    targets: BTreeMap<String, (String, String)>,
    alive: BTreeMap<String, bool>,
    alive_at: u64,
    panes: Panes,
    bus: Bus,
    world: World,
    /// The open jobs whose agent waits for a person (their waiting files, read every poll).
    waiting: BTreeMap<String, Waiting>,
}

impl State {
    fn new(store: crate::registry::store::Store, sessions: PathBuf, control: PathBuf, bus: Bus) -> State {
        let world = World {
            registry: store.registry.clone(),
            sessions_file: sessions.clone(),
            jobs: Vec::new(),
            sessions: Vec::new(),
            loops: Vec::new(),
            bus: bus.clone(),
            problems: Vec::new(),
            waiting: BTreeMap::new(),
        };
        State {
            jobs: scan::Jobs::new(store),
            sessions: scan::SessionsFile::new(sessions),
            loops: scan::Loops::new(control),
            targets: BTreeMap::new(),
            alive: BTreeMap::new(),
            alive_at: 0,
            panes: Panes::new(),
            bus,
            world,
            waiting: BTreeMap::new(),
        }
    }

    /// Looks at the files; returns (anything changed, the pane servers to list when they changed).
    fn poll(&mut self, ctx: &Ctx, now: u64, eager: bool) -> (bool, Option<Vec<(String, String)>>) {
        let mut changed = self.jobs.poll_with(now, eager);
        let mut new_targets = None;
        if self.sessions.poll(now) {
            changed = true;
            let targets = match &self.sessions.doc {
                Ok(doc) => world::targets(ctx, doc),
                Err(_) => BTreeMap::new(),
            };
            if targets != self.targets {
                let mut servers: Vec<(String, String)> = targets.values().cloned().collect();
                crate::sort::natural(&mut servers);
                servers.dedup();
                new_targets = Some(servers);
                self.targets = targets;
            }
        }
        let waiting: BTreeMap<String, Waiting> =
            crate::sort::ordered(self.jobs.rows().filter(|r| !r.finished()).filter_map(|r| {
                let w = joblog::read_waiting(&self.jobs.store.registry, r.job_id(), r.attempt, now)?;
                Some((r.job_id().to_string(), w))
            }));
        // The text ages by itself; only a change of who waits for what is a change.
        let key = |m: &BTreeMap<String, Waiting>| -> Vec<(String, Option<String>, u64)> {
            m.iter().map(|(k, w)| (k.clone(), w.approve.clone(), w.since_ms)).collect()
        };
        if key(&waiting) != key(&self.waiting) {
            changed = true;
        }
        self.waiting = waiting;
        let loops_changed = self.loops.poll(now);
        if loops_changed || now.saturating_sub(self.alive_at) >= 2_000 {
            self.alive_at = now;
            let alive: BTreeMap<String, bool> = crate::sort::ordered(
                self.loops
                    .checkpoints()
                    .iter()
                    .map(|cp| (cp.loop_id.clone(), world::loop_alive(&self.loops.control, cp))),
            );
            changed |= loops_changed || alive != self.alive;
            self.alive = alive;
        }
        if changed {
            self.rebuild();
        }
        (changed, new_targets)
    }

    /// Takes the helpers' findings; true when they changed the world.
    fn take_live(&mut self, panes: Panes, bus: Bus) -> bool {
        if panes == self.panes && bus == self.bus {
            return false;
        }
        self.panes = panes;
        self.bus = bus;
        self.rebuild();
        true
    }

    fn rebuild(&mut self) {
        let mut rows: Vec<_> = self.jobs.rows().cloned().collect();
        world::order_jobs(&mut rows);
        let mut problems = Vec::new();
        let sessions = match &self.sessions.doc {
            Ok(doc) => {
                let mut s = world::sessions(doc, &self.targets, &self.panes, &rows);
                for v in s.iter_mut().filter(|v| v.job.as_ref().is_some_and(|j| self.waiting.contains_key(&j.0))) {
                    v.state = "waiting".into();
                }
                s
            }
            Err(e) => {
                problems.push(format!("sessions file: {e}"));
                Vec::new()
            }
        };
        if !self.jobs.warnings.is_empty() {
            problems.push(format!("{} unreadable record(s): {}", self.jobs.warnings.len(), self.jobs.warnings[0]));
        }
        let loops = self
            .loops
            .checkpoints()
            .iter()
            .map(|cp| world::loop_view(cp, self.alive.get(&cp.loop_id).copied().unwrap_or(false)))
            .collect();
        self.world = World {
            registry: self.jobs.store.registry.clone(),
            sessions_file: self.sessions.path.clone(),
            jobs: rows,
            sessions,
            loops,
            bus: self.bus.clone(),
            problems,
            waiting: self.waiting.clone(),
        };
    }

    /// The job a row stands for (a session: its newest job; a loop: its newest delegation).
    fn job_of(&self, item: &Item) -> Option<String> {
        match item {
            Item::Job(id) => Some(id.clone()),
            Item::Session(n) => self.world.sessions.iter().find(|s| &s.name == n)?.last_job.clone(),
            Item::Loop(id) => {
                let l = self.world.loops.iter().find(|l| &l.id == id)?;
                l.job.clone().or_else(|| Some(l.loop_job.clone()))
            }
        }
    }

    /// The session a row belongs to.
    fn session_of(&self, item: &Item) -> Option<String> {
        match item {
            Item::Session(n) => Some(n.clone()),
            Item::Job(id) => {
                let job = self.world.jobs.iter().find(|j| j.job_id() == id)?;
                Some(job.session()).filter(|s| !s.is_empty()).map(str::to_string)
            }
            Item::Loop(id) => self.world.loops.iter().find(|l| &l.id == id).map(|l| l.creator.clone()),
        }
    }
}

fn mqtt_config(ctx: &Ctx, registry: &std::path::Path) -> Result<MqttConfig, String> {
    MqttConfig::from_ctx_near(ctx, Some(registry)).map_err(|e| one_line(&e.to_string()))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    if a.snapshot.is_none() && !(sys::is_tty(0) && sys::is_tty(1)) {
        // Not a terminal (a pipe, a file, a CI log): the plain table, redrawn every second.
        let mut args: Vec<OsString> = vec!["--follow".into()];
        if let Some(d) = &a.registry_dir {
            args.push("--registry-dir".into());
            args.push(d.clone().into());
        }
        return jobs::run(ctx, args);
    }
    let store = jobs::registry(ctx, a.registry_dir.as_deref())?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let mqtt = mqtt_config(ctx, &store.registry);
    if let Some((w, h)) = a.snapshot {
        let bus = live::bus_once(mqtt);
        let mut st = State::new(store, resolved.sessions.clone(), resolved.control_root.clone(), bus.clone());
        let now = clock::now_ms();
        let (_, targets) = st.poll(ctx, now, true);
        let panes = live::list_once(ctx, &targets.unwrap_or_default());
        st.take_live(panes, bus);
        let mut app = App::default();
        let lines = draw(&st.world, &mut app, w, h, clock::now_ms());
        ctx.say_raw(plain(&lines, w).as_bytes());
        return Ok(0);
    }
    let bus = match &mqtt {
        Ok(c) => Bus::Connecting(c.addr()),
        Err(e) => Bus::Unconfigured(e.clone()),
    };
    let mut st = State::new(store, resolved.sessions.clone(), resolved.control_root.clone(), bus);
    interactive(ctx, &mut st, mqtt)
}

/// A `mam` child running for a confirmed stop: its thread, and where it leaves its result line.
struct Running {
    handle: JoinHandle<()>,
}

fn interactive(ctx: &Ctx, st: &mut State, mqtt: Result<MqttConfig, String>) -> Result<i32, Failure> {
    let fail = |what: &str, e: std::io::Error| Failure::runtime(format!("ui: cannot {what}: {e}"));
    let waker = Arc::new(Waker::new().map_err(|e| fail("make a waker", e))?);
    let sigs = SignalPipe::install(&[libc::SIGWINCH, libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
        .map_err(|e| fail("install signal handlers", e))?;
    let epoll = Epoll::new().map_err(|e| fail("make an epoll", e))?;
    let stdin = std::io::stdin();
    epoll.add(&stdin, 0, EPOLL_IN).map_err(|e| fail("watch the terminal", e))?;
    epoll.add(&sigs, 1, EPOLL_IN).map_err(|e| fail("watch signals", e))?;
    epoll.add(&*waker, 2, EPOLL_IN).map_err(|e| fail("watch the helpers", e))?;
    let wake: live::Wake = {
        let w = waker.clone();
        Arc::new(move || w.wake())
    };
    let results: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let mut running: Vec<Running> = Vec::new();
    let code;
    {
        let live = Live::start(ctx, mqtt, wake.clone());
        let mut term = Term::enter(stdin.as_raw_fd(), std::io::stdout().as_raw_fd())
            .map_err(|e| fail("put the terminal in raw mode", e))?;
        let mut screen = Screen::new();
        let mut app = App::default();
        let (mut w, mut h) = term.size();
        let mut events = EpollEvents::with_capacity(8);
        let mut next_poll = std::time::Instant::now();
        let mut follow_watch = Watch::default();
        let mut eager = true;
        #[cfg(feature = "test-hooks")]
        let panic_key = ctx.var("MAM_TEST_UI_PANIC_KEY").and_then(|v| v.chars().next());
        let mut dirty = true;
        let mut next_draw = 0u64;
        code = 'main: loop {
            let now = clock::now_ms();
            if std::time::Instant::now() >= next_poll {
                next_poll = std::time::Instant::now() + TICK;
                let (changed, targets) = st.poll(ctx, now, std::mem::take(&mut eager));
                dirty |= changed;
                if let Some(t) = targets {
                    live.set_targets(t);
                }
                dirty |= refresh_view(st, &mut app, &mut follow_watch, now);
            }
            dirty |= st.take_live(live.panes(), live.bus());
            for r in std::mem::take(&mut *results.lock().unwrap_or_else(|e| e.into_inner())) {
                app.say(r, now + SAY_MS);
                dirty = true;
            }
            if dirty || now >= next_draw {
                let lines = draw(&st.world, &mut app, w, h, now);
                let bytes = screen.frame(&lines, w, h);
                if !bytes.is_empty() && term.write(&bytes).is_err() {
                    break 'main 0; // the terminal is gone
                }
                dirty = false;
                next_draw = next_change(&st.world, &app, now);
            }
            let wait = next_poll
                .saturating_duration_since(std::time::Instant::now())
                .min(Duration::from_millis(next_draw.saturating_sub(clock::now_ms())));
            if epoll.wait(&mut events, Some(wait)).is_err() {
                continue;
            }
            dirty |= events.iter().next().is_some();
            let ready: Vec<u64> = events.iter().map(|(t, _)| t).collect();
            for token in ready {
                match token {
                    0 => {
                        let mut buf = [0u8; 256];
                        let n = match sys::read_fd(stdin.as_raw_fd(), &mut buf) {
                            Ok(0) | Err(_) => break 'main 0, // the terminal hung up
                            Ok(n) => n,
                        };
                        for key in decode(&buf[..n]) {
                            #[cfg(feature = "test-hooks")]
                            if panic_key.map(crate::ui::keys::Key::Char) == Some(key) {
                                test_panic();
                            }
                            let shown = items(&st.world, &app.filter);
                            let action = app.key(key, &shown);
                            let now = clock::now_ms();
                            match action {
                                Action::None => {}
                                Action::Quit => break 'main 0,
                                Action::Jump(item) => {
                                    jump(ctx, st, &mut app, &mut term, &item, now);
                                    screen.invalidate();
                                    (w, h) = term.size();
                                }
                                Action::Report(item) => report(st, &mut app, &item, now),
                                Action::Events(item) => {
                                    follow_watch = Watch::default();
                                    events_view(st, &mut app, &item, now);
                                }
                                Action::AskStop(item) => ask_stop(st, &mut app, &item, now),
                                Action::Stop(what) => {
                                    app.say(format!("running `{}` ...", stop_line(&what)), u64::MAX);
                                    running.push(start_stop(ctx, st, what, results.clone(), wake.clone()));
                                }
                            }
                        }
                    }
                    1 => {
                        for sig in sigs.drain() {
                            if sig == libc::SIGWINCH {
                                (w, h) = term.size();
                                screen.invalidate();
                            } else {
                                break 'main 0;
                            }
                        }
                    }
                    _ => waker.drain(),
                }
            }
            if live.take_poke() {
                next_poll = std::time::Instant::now(); // a job reported: look at its files now
                eager = true;
            }
        };
        drop(term);
        drop(live);
    }
    for r in running {
        let _ = r.handle.join();
    }
    Ok(code)
}

/// The test hook's panic, in a function that cannot unwind: the panic hook runs, then the process
/// aborts with no destructor run, as a release build (`panic = "abort"`) does on any panic.
#[cfg(feature = "test-hooks")]
extern "C" fn test_panic() {
    panic!("MAM_TEST_UI_PANIC_KEY pressed");
}

/// An events.log view follows its file (true when it changed); a report view stays as it was.
fn refresh_view(st: &State, app: &mut App, watch: &mut Watch, now: u64) -> bool {
    let Mode::View(p) = &mut app.mode else { return false };
    let Some(job) = p.follow.clone() else { return false };
    let path = st.jobs.store.registry.join(&job).join("events.log");
    if watch.changed(&path, now) {
        if let Ok(lines) = pages::event_lines(&path) {
            p.replace(lines);
            return true;
        }
    }
    false
}

/// When the screen next changes with nothing new arriving: ages are shown in whole seconds (the
/// next second), a job turns silent at its own instant, a message goes away at its time.
fn next_change(world: &World, app: &App, now: u64) -> u64 {
    let mut next = (now / 1000 + 1) * 1000;
    for j in &world.jobs {
        if let Some(at) = j.silent_at_ms().filter(|&at| at > now) {
            next = next.min(at);
        }
    }
    if let Some((_, until)) = &app.message {
        if *until > now {
            next = next.min(*until);
        }
    }
    next
}

fn report(st: &State, app: &mut App, item: &Item, now: u64) {
    let Some(id) = st.job_of(item) else {
        app.say("no job here to show the report of", now + SAY_MS);
        return;
    };
    let Some(row) = st.world.jobs.iter().find(|j| j.job_id() == id) else {
        app.say(format!("job {id} is not in this registry"), now + SAY_MS);
        return;
    };
    let Some(path) = row.report_path().map(PathBuf::from) else {
        app.say(format!("job {id} has no report path"), now + SAY_MS);
        return;
    };
    if !path.is_file() {
        app.say(format!("job {id}: no report yet at {}", text::show_path(&path)), now + SAY_MS);
        return;
    }
    match pages::report_lines(&path) {
        Ok(lines) => {
            let title = format!("report of job {id} ({}): {}", row.status(), text::show_path(&path));
            app.mode = Mode::View(Pager::new(title, lines, None));
        }
        Err(e) => app.say(e, now + SAY_MS),
    }
}

fn events_view(st: &State, app: &mut App, item: &Item, now: u64) {
    let Some(id) = st.job_of(item) else {
        app.say("no job here to show the events of", now + SAY_MS);
        return;
    };
    let path = st.jobs.store.registry.join(&id).join("events.log");
    match pages::event_lines(&path) {
        Ok(lines) => {
            let title = format!("events.log of job {id}: {}", text::show_path(&path));
            app.mode = Mode::View(Pager::new(title, lines, Some(id)));
        }
        Err(e) => app.say(e, now + SAY_MS),
    }
}

fn ask_stop(st: &State, app: &mut App, item: &Item, now: u64) {
    match item {
        Item::Session(n) => {
            let running = st.sessions.doc.as_ref().ok().and_then(|d| d.row(n)).is_some_and(|r| r.running());
            if !running {
                app.say(format!("session {n} is not running"), now + SAY_MS);
                return;
            }
            app.confirm(
                StopWhat::Session(n.clone()),
                format!("Stop session {n}? (`mam stop {n}`: its open jobs are cancelled, its pane closed)"),
            );
        }
        Item::Job(id) => match st.world.jobs.iter().find(|j| j.job_id() == id) {
            Some(j) if j.finished() => {
                app.say(format!("job {id} is {} already", j.status()), now + SAY_MS);
            }
            Some(_) => app.confirm(
                StopWhat::Job(id.clone()),
                format!("Cancel job {id}? (`mam registry status {id} --set cancelled`)"),
            ),
            None => app.say(format!("job {id} is not in this registry"), now + SAY_MS),
        },
        Item::Loop(id) => app.say(
            format!("loop {id} stops with Ctrl-C in the terminal that runs it; `s` on its sessions stops them"),
            now + SAY_MS,
        ),
    }
}

fn stop_line(what: &StopWhat) -> String {
    match what {
        StopWhat::Session(n) => format!("mam stop {n}"),
        StopWhat::Job(id) => format!("mam registry status {id} --set cancelled"),
    }
}

/// Runs the stop as a child `mam` on a thread; its result line lands in `results`.
fn start_stop(ctx: &Ctx, st: &State, what: StopWhat, results: Arc<Mutex<Vec<String>>>, wake: live::Wake) -> Running {
    let argv: Vec<OsString> = match &what {
        StopWhat::Session(n) => vec!["stop".into(), n.into()],
        StopWhat::Job(id) => vec![
            "registry".into(),
            "status".into(),
            id.into(),
            "--set".into(),
            "cancelled".into(),
            "--reason".into(),
            "cancelled in mam ui".into(),
            "--registry-dir".into(),
            st.jobs.store.registry.clone().into(),
        ],
    };
    let exe = crate::ops::mam_exe(ctx);
    let env = ctx.child_env_for(ChildRole::BrokerClient);
    let cwd = ctx.cwd().to_path_buf();
    let line = stop_line(&what);
    let handle = std::thread::spawn(move || {
        let result = match exe {
            Err(e) => format!("`{line}`: {e}"),
            Ok(exe) => {
                let mut c = std::process::Command::new(exe);
                c.args(&argv).env_clear().envs(env).current_dir(cwd);
                match crate::pane::run_capture(&mut c, Duration::from_secs(300), &line) {
                    Err(e) => format!("`{line}`: {e}"),
                    Ok(out) => {
                        let pick = |b: &[u8]| {
                            String::from_utf8_lossy(b).lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string)
                        };
                        let said = if out.status.success() {
                            pick(&out.stdout).or_else(|| pick(&out.stderr))
                        } else {
                            pick(&out.stderr).or_else(|| pick(&out.stdout))
                        };
                        let rc = out.status.code().map_or("killed".into(), |c| format!("exit {c}"));
                        format!("`{line}` ({rc}): {}", one_line(&said.unwrap_or_default()))
                    }
                }
            }
        };
        results.lock().unwrap_or_else(|e| e.into_inner()).push(result);
        wake();
    });
    Running { handle }
}

/// Enter: the plan of `mam attach` for the row's session, run. A plan that takes the terminal (an
/// attach from outside tmux, herdr's attach) runs with the terminal handed over and given back.
fn jump(ctx: &Ctx, st: &State, app: &mut App, term: &mut Term, item: &Item, now: u64) {
    let Some(name) = st.session_of(item) else {
        app.say("no session here to go to", now + SAY_MS);
        return;
    };
    let doc = match &st.sessions.doc {
        Ok(d) => d,
        Err(e) => {
            app.say(format!("sessions file: {e}"), now + SAY_MS);
            return;
        }
    };
    let Some(row) = doc.row(&name) else {
        app.say(format!("session {name} is not in the sessions file"), now + SAY_MS);
        return;
    };
    let target = match attach_cmd::target(ctx, row) {
        Ok(t) => t,
        Err(f) => {
            app.say(text::without_error_prefix(&f.line).to_string(), now + SAY_MS);
            return;
        }
    };
    let here = Here::from_vars(ctx.var("TMUX").as_deref(), ctx.var("HERDR_ENV").as_deref());
    let plan = match attach::plan(&target, &here) {
        Ok(p) => p,
        Err(e) => {
            app.say(format!("{e}"), now + SAY_MS);
            return;
        }
    };
    let Some((last, before)) = plan.steps.split_last() else { return };
    for s in before {
        if let Err(f) = attach_cmd::run_step(ctx, s) {
            app.say(text::without_error_prefix(&f.line).to_string(), now + SAY_MS);
            return;
        }
    }
    if plan.takes_terminal {
        if let Err(e) = term.suspend() {
            app.say(format!("cannot hand the terminal over: {e}"), now + SAY_MS);
            return;
        }
        let status = attach_cmd::command(ctx, last).status();
        let back = term.resume();
        let said = match (status, back) {
            (_, Err(e)) => format!("cannot take the terminal back: {e}"),
            (Ok(s), Ok(())) if s.success() => format!("back from {name}"),
            (Ok(s), Ok(())) => format!("`{last}` ended with {s}"),
            (Err(e), Ok(())) => format!("cannot run `{last}`: {e}"),
        };
        app.say(said, clock::now_ms() + SAY_MS);
        return;
    }
    match attach_cmd::run_step(ctx, last) {
        Ok(()) => app.say(
            plan.note
                .map(|n| text::without_error_prefix(&n).trim_start_matches("NOTE: ").to_string())
                .unwrap_or_else(|| format!("switched to {name}'s pane; come back the way you left")),
            now + SAY_MS,
        ),
        Err(f) => app.say(text::without_error_prefix(&f.line).to_string(), now + SAY_MS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let p = |v: &[&str]| parse_args(cli::argv(v));
        assert!(matches!(p(&["--snapshot", "80x24"]), Ok(Parsed::Run(Args { snapshot: Some((80, 24)), .. }))));
        assert_eq!(p(&["--snapshot", "80"]).unwrap_err().rc, 2);
        assert_eq!(p(&["--snapshot", "5x5"]).unwrap_err().rc, 2);
        assert_eq!(p(&["--bogus"]).unwrap_err().rc, 2);
        assert!(matches!(p(&["--registry-dir", "x"]), Ok(Parsed::Run(Args { registry_dir: Some(_), .. }))));
    }
}
