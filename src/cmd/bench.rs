//! `mam bench` (issue 20, docs/PERFORMANCE.md): the comparisons of the performance table, run on
//! this machine with their anchors measured in the same run (`mosquitto_pub -q 1`, `/bin/true`,
//! an idle `sleep`, mosquitto itself), printed as a table and as sentences, or as JSON; and
//! `loop-round`, which times the review loop's own steps of one pinned round (everything but the
//! agents) through the code `mam loop` runs, never changing the repository's index, status or refs
//! (the snapshots are ref-less commits). The measuring parts are `crate::bench`.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::measure::{self, Guard};
use crate::bench::{fan, load};
use crate::bench::{fixture, Machine, Qty, Report, Row};
use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::diffcollect::{self, TempDir};
use crate::knob;
use crate::paths;
use crate::review::checkpoint::{self, Checkpoint, JobRow, ReviewerRow, Round, RoundIdentity};
use crate::review::evidence::{self, Verdict};
use crate::review::git::{self, Guard as DiffGuard, Repo};
use crate::review::prompt;
use crate::sys;
use crate::text::show_path;

pub const USAGE: &str = "
Usage: mam bench [--quick] [--json] [--sizes N,N,...] [--runs N] [BROKER OPTIONS]
       mam bench broker [--quick] [--json] [BROKER OPTIONS]
       mam bench publish [--runs N] [--json]
       mam bench loop-round --repo PATH --base REF [--reps N]

With no benchmark named, runs the comparisons of docs/PERFORMANCE.md on this machine, each against
an anchor measured in the same run, alternating the two (the order swapped every round) and taking
medians; the machine's load (/proc/loadavg) is printed at the start and the end:
  mam publish --event progress (engine, record, events.log, signed event, retained state, audit)
                           against mosquitto_pub -q 1 of the same payload to the same broker
                           (and again with the registry on tmpfs, for the record: no fsync cost)
  mam pub -q 1             against mosquitto_pub -q 1
  mam --version            against /bin/true
  the heartbeat timer's resident set (VmRSS; its own memory is RssAnon) against an idle `sleep`
  the binary's size
  mam registry list, mam jobs and mam status over registries of each size (default 1000, 10000,
  100000; --quick 1000, 10000): median wall time and peak resident set
  the embedded broker against mosquitto (the broker rows, below)
The broker for the publish rows is mosquitto when it is installed (looked up on PATH and in the sbin
directories), else `mam broker`; rows whose anchor is not installed say so and are not measured.
Every file is written under a fresh directory in TMPDIR (the 100,000-record registry takes about
450 MB) and removed at the end. Children get a clean environment (PATH, HOME, TMPDIR; no env file).
A full run takes a few minutes; --quick about 20 s.

Options:
  --quick        fewer runs, smaller registries and message counts
  --json         one JSON object: command, version, machine (cores, kernel, load), rows (id,
                 measure, now, anchor, ratio, target, pass, note, detail: the broker rows'
                 samples per round and side)
  --sizes LIST   the registry sizes, comma separated (each at least 1)
  --runs N       the alternating runs of every process comparison (default 500 for --version,
                 50 for publish, 100 for pub, 3-5 per registry size; --quick fewer)

broker: the broker rows alone. `mam broker` (its defaults, persistence on, the state file under the
temp directory) against mosquitto (persistence off, max_inflight_messages 100 and
max_queued_messages 0: the generator's window, and no queue limit, so neither broker drops or
refuses what the other takes), a fresh broker for each round and side, the two alternating (the
order swapped every round), medians of the rounds:
  delivery at QoS 0, 1 and 2: one publisher and one subscriber (two threads of this process that
    share no lock), 64-byte messages on one topic, one write per PUBLISH; at QoS 1 and 2 at most
    100 messages unfinished (PUBACK; PUBREC, PUBREL, PUBCOMP), at QoS 0 as fast as the broker
    reads them: throughput (first send to last delivery), p50 and p99 publish-to-delivery
    latency, the broker's CPU per message (/proc/<pid>/task/*/schedstat)
  the resident set (VmRSS) with each count of idle clients connected, each subscribed to a topic
    of its own; then delivery at QoS 0 and 1 again with the largest count still connected
  fan-in and fan-out with mosquitto's own clients (when mosquitto_pub and mosquitto_sub are
    installed): 1, 2, 4, 8 and 32 `mosquitto_pub -l -q 1` to one `mosquitto_sub -q 1`, and one to 8,
    each publisher sending 5,000 lines (--quick 1,000) of its own; deliveries per second from the
    first publisher start to the last line read, every line due once at every subscriber
  the load generator's own CPU: its busier thread's share of one core (median of the runs) in
    the mosquitto runs (target: at most 50%, so mosquitto's numbers are its own) and in mam's
The soft RLIMIT_NOFILE is raised to the hard limit first; mosquitto, started after, inherits it.
  --rounds N     alternating rounds (default 5; --quick 1)
  --messages N   messages per delivery run (default 100000; --quick 2000); each fan-in and
                 fan-out publisher sends N/20 lines (at most 5000; --quick 1000)
  --clients LIST idle client counts, comma separated (default 1000,5000; --quick 100,500)
  --batched      the publisher writes every PUBLISH its window lets out (at QoS 0: 100) in one
                 write instead of one write each

publish: where `mam publish --event progress` spends its time. Runs it N times (default 50) with
MAM_TRACE=1, alternating with mosquitto_pub -q 1 of the same payload to the same broker, and prints
per step the median start and length (ms from the command's start, after the process is loaded):
  parse      arguments, env file, paths, broker settings    read     the record, before any lock
  lock       L3 (shared) and events.log opened              record   L1, decision, record write,
  audit      audit.jsonl and status.json (its fsync)                 its fsync and the directory's
  sign       the signed event                               events.log  the line appended
  connect    TCP, CONNECT, CONNACK                          event    PUBLISH to its PUBACK
  unsent     store and forward's look: events.log since the last clean publish, and the audit
  recheck    the record read again for the state            state    the retained state to PUBACK
  disconnect DISCONNECT and close                           published  the audit entry after the wire
  print      the result line
then the whole process (wall) against mosquitto_pub, and what lies outside the steps (exec, the
dynamic loader, exit). Steps that overlap show it in their start times.

loop-round: times the review loop's own work in one pinned review round with one local reviewer and
tree isolation, N times (default 15), through the library code `mam loop` runs, in the loop's order:
  pin         the snapshot (refusal checks, temporary index, add -A, write-tree, commit-tree)
  guard       the empty-change guard (git diff --quiet <base> <snapshot>)
  tree        git worktree add --detach of the snapshot under TMPDIR (the review tree)
  diff        `<this binary> diff-collect <repo> <base> <snapshot>` as a child, into a file
  prompt      the context facts (head, branch, commit count, uncommitted changes), the context,
              identity and review text, written as the prompt files
  judge       the reviewer's report read back and judged (a PASS with the round's identity)
  remeasure   the fingerprint (staleness)
  remove      git worktree remove of the review tree
  checkpoint  the round's four checkpoint writes and the report copy
No agent, broker, registry record or delegate-job is involved. The control plane is resolved as by
every command (run with WORKSPACE_ROOT=<repo> for a loop whose control root is the source); its
paths are left out as the loop leaves them out. The change since <base> must not be empty.
Stdout: one line per repetition,
  rep=<i> total_ms=<t> pin=<ms> guard=<ms> tree=<ms> diff=<ms> prompt=<ms> judge=<ms> ...
then `median_ms=<m> reps=<n>`.

Exit codes: 0 ok (also when targets are not met: the table says which), 1 a step failed (the line
names it), 2 usage.
";

#[derive(Debug)]
enum Args {
    Table(TableArgs),
    Broker(TableArgs),
    Publish { runs: usize, json: bool },
    LoopRound { repo: PathBuf, base: String, reps: u32 },
}

#[derive(Debug, Default)]
struct TableArgs {
    quick: bool,
    json: bool,
    sizes: Option<Vec<usize>>,
    runs: Option<usize>,
    rounds: Option<usize>,
    messages: Option<usize>,
    clients: Option<Vec<usize>>,
    batched: bool,
}

fn sizes_arg(v: &str) -> Result<Vec<usize>, Failure> {
    list_arg("--sizes", v)
}

/// A comma-separated list of counts, each at least 1.
fn list_arg(flag: &str, v: &str) -> Result<Vec<usize>, Failure> {
    let bad = || Failure::usage(format!("{flag}: expected counts like 1000,10000, got '{}'", crate::text::one_line(v)));
    let sizes: Vec<usize> = v
        .split(',')
        .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if sizes.is_empty() {
        return Err(bad());
    }
    Ok(sizes)
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut which, mut repo, mut base, mut reps) = (None, None, None, 15);
    let mut t = TableArgs::default();
    let mut table_flag = None;
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if which.is_none() => which = Some(cli::utf8("benchmark", v)?),
            Long("repo") => repo = Some(PathBuf::from(p.value()?)),
            Long("base") => base = Some(cli::utf8("--base", p.value()?)?),
            Long("reps") => reps = knob::flag("--reps", &p.value()?, 1)?,
            Long("quick") => {
                t.quick = true;
                table_flag = Some("--quick");
            }
            Long("json") => {
                t.json = true;
                table_flag = Some("--json");
            }
            Long("sizes") => {
                t.sizes = Some(sizes_arg(&cli::utf8("--sizes", p.value()?)?)?);
                table_flag = Some("--sizes");
            }
            Long("runs") => {
                t.runs = Some(knob::flag("--runs", &p.value()?, 1)? as usize);
                table_flag = Some("--runs");
            }
            Long("rounds") => {
                t.rounds = Some(knob::flag("--rounds", &p.value()?, 1)? as usize);
                table_flag = Some("--rounds");
            }
            Long("messages") => {
                t.messages = Some(knob::flag("--messages", &p.value()?, 1)? as usize);
                table_flag = Some("--messages");
            }
            Long("clients") => {
                let mut c = list_arg("--clients", &cli::utf8("--clients", p.value()?)?)?;
                crate::sort::natural(&mut c);
                c.dedup();
                t.clients = Some(c);
                table_flag = Some("--clients");
            }
            Long("batched") => {
                t.batched = true;
                table_flag = Some("--batched");
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    let broker_flag = t.rounds.is_some() || t.messages.is_some() || t.clients.is_some() || t.batched;
    match (which.as_deref(), repo, base) {
        (None, None, None) => Ok(Parsed::Run(Args::Table(t))),
        (Some("broker"), None, None) if t.sizes.is_none() && t.runs.is_none() => Ok(Parsed::Run(Args::Broker(t))),
        (Some("broker"), _, _) => Err(Failure::usage(
            "bench broker: takes --quick, --json, --rounds, --messages, --clients and --batched only (see mam bench --help)",
        )),
        (Some("publish"), _, _) if broker_flag => {
            Err(Failure::usage("bench publish: takes --runs and --json only (see mam bench --help)"))
        }
        (Some("publish"), None, None) if !t.quick && t.sizes.is_none() => {
            Ok(Parsed::Run(Args::Publish { runs: t.runs.unwrap_or(50), json: t.json }))
        }
        (Some("publish"), _, _) => {
            Err(Failure::usage("bench publish: takes --runs and --json only (see mam bench --help)"))
        }
        (None, _, _) => Err(Failure::usage("bench: --repo and --base belong to loop-round (see mam bench --help)")),
        (Some("loop-round"), _, _) if table_flag.is_some() => {
            Err(Failure::usage(format!("bench loop-round: unexpected option {}", table_flag.unwrap_or_default())))
        }
        (Some("loop-round"), Some(repo), Some(base)) if !base.is_empty() => {
            Ok(Parsed::Run(Args::LoopRound { repo, base, reps }))
        }
        (Some("loop-round"), _, _) => {
            Err(Failure::usage("bench: give loop-round --repo PATH --base REF (see mam bench --help)"))
        }
        (Some(other), _, _) => Err(Failure::usage(format!(
            "bench: unknown benchmark '{}' (expected broker, publish or loop-round, or none for the table)",
            crate::text::one_line(other)
        ))),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    match a {
        Args::Table(t) => table(ctx, &t),
        Args::Broker(t) => broker_table(ctx, &t),
        Args::Publish { runs, json } => publish_breakdown(ctx, runs, json),
        Args::LoopRound { repo, base, reps } => loop_round(ctx, &repo, &base, reps),
    }
}

fn loop_round(ctx: &Ctx, repo: &Path, base: &str, reps: u32) -> Result<i32, Failure> {
    let bench = Bench::new(ctx, repo, base)?;
    let mut totals = Vec::new();
    for rep in 1..=reps {
        let steps = bench.round(rep)?;
        let total: f64 = steps.iter().map(|(_, ms)| ms).sum();
        let mut line = format!("rep={rep} total_ms={total:.1}");
        for (name, ms) in &steps {
            line.push_str(&format!(" {name}={ms:.1}"));
        }
        ctx.say(&line);
        totals.push(total);
    }
    crate::sort::by(&mut totals, f64::total_cmp);
    let median = totals[totals.len() / 2];
    ctx.say(&format!("median_ms={median:.1} reps={reps}"));
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// The table

/// How many runs and how large, for a full run or `--quick`.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    version_runs: usize,
    publish_runs: usize,
    pub_runs: usize,
    sizes: Vec<usize>,
    registry_runs: Option<usize>,
    timer_wait: Duration,
    broker: BrokerPlan,
}

/// How the broker rows run.
#[derive(Debug, Clone)]
struct BrokerPlan {
    rounds: usize,
    messages: usize,
    /// Idle client counts whose resident set is read, ascending; the largest is also connected
    /// during the second set of delivery runs.
    clients: Vec<usize>,
    /// One write per PUBLISH (the default), or each window's PUBLISHes in one (`--batched`).
    writes: load::Writes,
    /// Lines each `mosquitto_pub -l` sends in the fan-in and fan-out runs.
    fan_messages: usize,
}

impl Plan {
    fn new(t: &TableArgs) -> Plan {
        let mut p = if t.quick {
            Plan {
                quick: true,
                version_runs: 100,
                publish_runs: 10,
                pub_runs: 20,
                sizes: vec![1000, 10_000],
                registry_runs: Some(3),
                timer_wait: Duration::from_millis(2500),
                broker: BrokerPlan {
                    rounds: 1,
                    messages: 2000,
                    clients: vec![100, 500],
                    writes: load::Writes::PerMessage,
                    fan_messages: 1000,
                },
            }
        } else {
            Plan {
                quick: false,
                version_runs: 500,
                publish_runs: 50,
                pub_runs: 100,
                sizes: vec![1000, 10_000, 100_000],
                registry_runs: None,
                timer_wait: Duration::from_secs(5),
                broker: BrokerPlan {
                    rounds: 5,
                    messages: 100_000,
                    clients: vec![1000, 5000],
                    writes: load::Writes::PerMessage,
                    fan_messages: 5000,
                },
            }
        };
        if let Some(s) = &t.sizes {
            p.sizes = s.clone();
        }
        if let Some(n) = t.runs {
            (p.version_runs, p.publish_runs, p.pub_runs, p.registry_runs) = (n, n, n, Some(n));
        }
        if let Some(n) = t.rounds {
            p.broker.rounds = n;
        }
        if let Some(n) = t.messages {
            p.broker.messages = n;
            // The fan runs scale with it: each publisher sends N/20 lines, at most the default.
            p.broker.fan_messages = p.broker.fan_messages.min((n / 20).max(1));
        }
        if let Some(c) = &t.clients {
            p.broker.clients = c.clone();
        }
        if t.batched {
            p.broker.writes = load::Writes::Batched;
        }
        p
    }

    fn registry_runs(&self, n: usize) -> usize {
        self.registry_runs.unwrap_or(if n >= 100_000 { 3 } else { 5 })
    }
}

fn fail(step: &str, detail: impl std::fmt::Display) -> Failure {
    Failure::runtime(format!("bench: {step}: {detail}"))
}

/// What the rows share: this binary, the temp directory, the children's environment, the tools.
struct Env {
    exe: PathBuf,
    dir: TempDir,
    base_env: Vec<(String, String)>,
    mosquitto: Option<PathBuf>,
    mosquitto_pub: Option<PathBuf>,
    mosquitto_sub: Option<PathBuf>,
    true_bin: PathBuf,
    sleep_bin: Option<PathBuf>,
}

impl Env {
    /// `program args` with the clean environment, in the temp directory, output on /dev/null.
    fn cmd(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .env_clear()
            .envs(self.base_env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    fn mam(&self, args: &[&str]) -> Command {
        self.cmd(&self.exe, args)
    }

    /// Runs a set-up command that must succeed; returns its stdout.
    fn setup(&self, mut c: Command) -> Result<String, Failure> {
        let out = c.stdout(Stdio::piped()).stderr(Stdio::piped()).output().map_err(|e| fail(&measure::shown(&c), e))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(fail(&measure::shown(&c), err.lines().next().unwrap_or("failed")));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// An executable named `name` on PATH or in the sbin directories (mosquitto lives in /usr/sbin).
fn find_program(ctx: &Ctx, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = ctx.var("PATH").unwrap_or_default();
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn free_port() -> Result<u16, Failure> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| fail("a free port", e))?;
    l.local_addr().map(|a| a.port()).map_err(|e| fail("a free port", e))
}

/// A broker child listening on 127.0.0.1:`port`.
struct Broker {
    guard: Guard,
    port: u16,
}

impl Broker {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mam,
    Mosquitto,
}

fn start_broker(env: &Env, kind: Kind) -> Result<Broker, Failure> {
    let port = free_port()?;
    let ps = port.to_string();
    let mut c = match kind {
        Kind::Mam => {
            // Its defaults, persistence on: the state file (written only on a change, and these runs
            // change nothing to save) in the temp directory, never the user's control root.
            let mut c = env.mam(&["broker", "--allow-anonymous", "--port", &ps, "--max-connections", "20000"]);
            c.env("WORKSPACE_ROOT", &env.dir.path);
            c
        }
        Kind::Mosquitto => {
            let conf = env.dir.path.join(format!("mosquitto-{port}.conf"));
            // max_queued_messages 0: with its default (1000) mosquitto drops QoS 1 messages for a
            // subscriber that falls behind the publisher, and the run would never complete.
            // max_inflight_messages 100, the generator's window: with its default (20) it answers
            // the 21st unfinished QoS 2 PUBLISH of a 3.1.1 client with PUBREC 0x97 (a 5.0 reason
            // code) and closes the connection; and `mam broker` lets a subscriber hold 100 too.
            let mut text = format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_connections -1\n\
                 max_queued_messages 0\nmax_inflight_messages {}\nlog_type none\n",
                load::WINDOW
            );
            if sys::geteuid() == 0 {
                text.push_str("user root\n");
            }
            sys::write_file(&conf, text.as_bytes()).map_err(|e| fail("mosquitto.conf", e))?;
            let prog = env.mosquitto.clone().unwrap_or_default();
            env.cmd(&prog, &["-c", &conf.to_string_lossy()])
        }
    };
    // A bench killed mid-run (a test's deadline) must not leave its broker listening.
    sys::set_parent_death_signal(&mut c, libc::SIGTERM);
    let guard = Guard(sys::spawn(&mut c).map_err(|e| fail(&measure::shown(&c), e))?);
    let b = Broker { guard, port };
    let addr = b.addr();
    if !measure::wait_until(Duration::from_secs(10), || TcpStream::connect(addr).is_ok()) {
        return Err(fail(&measure::shown(&c), format!("nothing listening on {addr} after 10 s")));
    }
    Ok(b)
}

/// The temp directory, the children's clean environment and the tools found.
fn make_env(ctx: &Ctx) -> Result<Env, Failure> {
    let exe = std::env::current_exe().map_err(|e| fail("this binary", e))?;
    let dir = TempDir::create(ctx, "mam-bench").map_err(|e| fail("temp directory", show_path(&e.path)))?;
    let path = ctx.var("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let dir_s = dir.path.display().to_string();
    let base_env = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), ctx.var("HOME").unwrap_or_else(|| dir_s.clone())),
        ("TMPDIR".to_string(), dir_s.clone()),
        ("LANG".to_string(), "C".to_string()),
        // No env file: the user's settings must not change what is measured.
        ("MAM_ENV_FILE".to_string(), format!("{dir_s}/no.env")),
        ("MAM_NO_SUBSCRIBER_DAEMON".to_string(), "1".to_string()),
    ];
    Ok(Env {
        exe,
        base_env,
        mosquitto: find_program(ctx, "mosquitto"),
        mosquitto_pub: find_program(ctx, "mosquitto_pub"),
        mosquitto_sub: find_program(ctx, "mosquitto_sub"),
        true_bin: find_program(ctx, "true").unwrap_or_else(|| PathBuf::from("/bin/true")),
        sleep_bin: find_program(ctx, "sleep"),
        dir,
    })
}

/// The report's head: the command, this build, the machine and its load now.
fn new_report(env: &Env, command: &str, quick: bool) -> Report {
    let dir_s = env.dir.path.display().to_string();
    let mosquitto_version = env.mosquitto.as_ref().and_then(|m| {
        let out = Command::new(m).arg("-h").stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
        String::from_utf8_lossy(&out.stdout).lines().next().map(|l| crate::text::one_line(l.trim()))
    });
    Report {
        command: format!("{command}{}", if quick { " --quick" } else { "" }),
        version: crate::version::long(),
        machine: Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
            load_start: measure::loadavg(),
            load_end: None,
            tmp: dir_s,
            mosquitto: mosquitto_version,
        },
        rows: Vec::new(),
    }
}

/// Prints the report as text or JSON, with the load at the end.
fn print_report(ctx: &mut Ctx, mut report: Report, json: bool) -> Result<i32, Failure> {
    report.machine.load_end = measure::loadavg();
    if json {
        ctx.say(&serde_json::to_string_pretty(&report.json()).unwrap_or_default());
    } else {
        ctx.say_raw(report.text().as_bytes());
    }
    Ok(0)
}

fn broker_table(ctx: &mut Ctx, t: &TableArgs) -> Result<i32, Failure> {
    let plan = Plan::new(t);
    let env = make_env(ctx)?;
    let mut report = new_report(&env, "mam bench broker", plan.quick);
    report.rows = broker_rows(&env, &plan.broker);
    print_report(ctx, report, t.json)
}

fn table(ctx: &mut Ctx, t: &TableArgs) -> Result<i32, Failure> {
    let plan = Plan::new(t);
    let env = make_env(ctx)?;
    let mut report = new_report(&env, "mam bench", plan.quick);
    let rows = &mut report.rows;
    rows.push(binary_row(&env)?);
    rows.push(version_row(&env, &plan)?);
    {
        // One broker for the publish rows and the timer: mosquitto when installed.
        let broker = start_broker(&env, if env.mosquitto.is_some() { Kind::Mosquitto } else { Kind::Mam })?;
        rows.extend(publish_rows(&env, &plan, &broker)?);
    }
    for &n in &plan.sizes {
        rows.extend(registry_rows(&env, &plan, n)?);
    }
    rows.extend(growth_row(rows, &plan.sizes));
    rows.extend(broker_rows(&env, &plan.broker));
    print_report(ctx, report, t.json)
}

fn binary_row(env: &Env) -> Result<Row, Failure> {
    let len = std::fs::metadata(&env.exe).map_err(|e| fail("this binary", e))?.len();
    let mut r = Row::new("binary_size", "release binary size");
    r.now = Some(Qty::bytes(len));
    r.target = "<= 2.00 MB".into();
    r.pass = Some(len <= 2_000_000);
    let linked = if cfg!(target_feature = "crt-static") { "static (libc linked in)" } else { "dynamically linked" };
    r.note = format!("{} bytes, {linked}", len);
    if cfg!(debug_assertions) {
        r.note.push_str("; this is a debug build, the target is for a release build");
        r.pass = None;
    }
    Ok(r)
}

/// A row comparing two medians: `ratio = now / anchor`, met when `<= max`.
fn ratio_row(id: &str, measure: &str, now: f64, anchor_what: &str, anchor: f64, max: f64, runs: usize) -> Row {
    let ratio = now / anchor.max(1e-9);
    Row {
        now: Some(Qty::ms(now)),
        anchor: Some((anchor_what.into(), Qty::ms(anchor))),
        ratio: Some(ratio),
        target: format!("<= {max:.1}"),
        pass: Some(ratio <= max),
        note: format!("wall time, medians of {runs} alternating runs"),
        ..Row::new(id, measure)
    }
}

fn version_row(env: &Env, plan: &Plan) -> Result<Row, Failure> {
    let (mut a, mut b) = (env.mam(&["--version"]), env.cmd(&env.true_bin, &[]));
    let s = measure::alternate(plan.version_runs, &mut [&mut a, &mut b]).map_err(|e| fail("--version", e))?;
    let true_s = env.true_bin.display().to_string();
    Ok(ratio_row(
        "version",
        &format!("mam --version / {true_s}"),
        measure::median_ms(&s[0]),
        &true_s,
        measure::median_ms(&s[1]),
        1.3,
        plan.version_runs,
    ))
}

/// A registered, started job `bench` in `<base>/publish/jobs` on `broker`: the registry path and a
/// payload the size of its signed events (its events.log's first line).
fn publish_job(env: &Env, broker: &Broker, base: &Path) -> Result<(String, String), Failure> {
    let port = broker.port.to_string();
    let reg = base.join("publish").join("jobs");
    let reg_s = reg.display().to_string();
    let with_broker = |mut c: Command| {
        c.env("MQTT_BROKER", "127.0.0.1").env("MQTT_PORT", &port);
        c
    };
    env.setup(with_broker(env.mam(&[
        "registry",
        "register",
        "--registry-dir",
        &reg_s,
        "--session",
        "bench",
        "--job-id",
        "bench",
    ])))?;
    env.setup(with_broker(env.mam(&["publish", "--registry-dir", &reg_s, "--job-id", "bench", "--event", "started"])))?;
    let events = reg.join("bench").join("events.log");
    let first = std::fs::read_to_string(&events).map_err(|e| fail("events.log", e))?;
    // A payload the size of a signed event, so both sides move the same bytes.
    Ok((reg_s, first.lines().next().unwrap_or("{}").to_string()))
}

/// `mam publish` and `mam pub` against `mosquitto_pub -q 1`, and the heartbeat timer's memory.
fn publish_rows(env: &Env, plan: &Plan, broker: &Broker) -> Result<Vec<Row>, Failure> {
    let port = broker.port.to_string();
    let (reg_s, payload) = publish_job(env, broker, &env.dir.path)?;
    let with_broker = |mut c: Command| {
        c.env("MQTT_BROKER", "127.0.0.1").env("MQTT_PORT", &port);
        c
    };
    let mut rows = Vec::new();
    const PUBLISH: &str = "mam publish --event progress / mosquitto_pub -q 1";
    const PUB: &str = "mam pub -q 1 / mosquitto_pub -q 1";
    const PUBLISH_TMPFS: &str = TMPFS_PUBLISH;
    match &env.mosquitto_pub {
        None => {
            rows.push(Row::skipped("publish", PUBLISH, "<= 1.0", "mosquitto_pub is not installed"));
            rows.push(Row::skipped("publish_tmpfs", PUBLISH_TMPFS, "-", "mosquitto_pub is not installed"));
            rows.push(Row::skipped("pub", PUB, "<= 0.6", "mosquitto_pub is not installed"));
        }
        Some(mp) => {
            let anchor = |topic: &str, msg: &str| {
                env.cmd(mp, &["-h", "127.0.0.1", "-p", &port, "-q", "1", "-t", topic, "-m", msg])
            };
            let mut a = with_broker(env.mam(&[
                "publish",
                "--registry-dir",
                &reg_s,
                "--job-id",
                "bench",
                "--event",
                "progress",
            ]));
            let mut b = anchor("mam/jobs/bench/events", &payload);
            let s = measure::alternate(plan.publish_runs, &mut [&mut a, &mut b]).map_err(|e| fail("publish", e))?;
            let mut r = ratio_row(
                "publish",
                PUBLISH,
                measure::median_ms(&s[0]),
                "mosquitto_pub -q 1",
                measure::median_ms(&s[1]),
                1.0,
                plan.publish_runs,
            );
            r.note.push_str(&format!("; registry under {}", show_path(&env.dir.path)));
            rows.push(r);
            rows.push(tmpfs_publish_row(env, plan, broker, &anchor)?);
            let mut a =
                env.mam(&["pub", "-h", "127.0.0.1", "-p", &port, "-q", "1", "-t", "mam-bench/pub", "-m", "hello"]);
            let mut b = anchor("mam-bench/pub", "hello");
            let s = measure::alternate(plan.pub_runs, &mut [&mut a, &mut b]).map_err(|e| fail("pub", e))?;
            rows.push(ratio_row(
                "pub",
                PUB,
                measure::median_ms(&s[0]),
                "mosquitto_pub -q 1",
                measure::median_ms(&s[1]),
                0.6,
                plan.pub_runs,
            ));
        }
    }
    rows.push(timer_row(env, plan, &reg_s, &with_broker)?);
    Ok(rows)
}

const TMPFS_PUBLISH: &str = "the same with the registry on tmpfs (fsync costs nothing there)";

/// The publish row again with the registry in /dev/shm: what the comparison is without the disk
/// (the record's and status.json's fsyncs), for the record (no target).
fn tmpfs_publish_row(
    env: &Env,
    plan: &Plan,
    broker: &Broker,
    anchor: &dyn Fn(&str, &str) -> Command,
) -> Result<Row, Failure> {
    const MEASURE: &str = TMPFS_PUBLISH;
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return Ok(Row::skipped("publish_tmpfs", MEASURE, "-", "no /dev/shm"));
    }
    let name = sys::random_hex(8).map_err(|e| fail("tmpfs directory", e))?;
    let dir = TempDir { path: shm.join(format!("mam-bench-{name}")) };
    sys::create_dir_all(&dir.path).map_err(|e| fail("tmpfs directory", e))?;
    let (reg, payload) = publish_job(env, broker, &dir.path)?;
    let port = broker.port.to_string();
    let mut a = env.mam(&["publish", "--registry-dir", &reg, "--job-id", "bench", "--event", "progress"]);
    a.env("MQTT_BROKER", "127.0.0.1").env("MQTT_PORT", &port);
    let mut b = anchor("mam/jobs/bench/events", &payload);
    let s = measure::alternate(plan.publish_runs, &mut [&mut a, &mut b]).map_err(|e| fail("publish on tmpfs", e))?;
    let (now, anc) = (measure::median_ms(&s[0]), measure::median_ms(&s[1]));
    let mut r = Row::new("publish_tmpfs", MEASURE);
    r.now = Some(Qty::ms(now));
    r.anchor = Some(("mosquitto_pub -q 1".into(), Qty::ms(anc)));
    r.ratio = Some(now / anc.max(1e-9));
    r.note = format!("wall time, medians of {} alternating runs; registry under /dev/shm", plan.publish_runs);
    Ok(r)
}

fn timer_row(env: &Env, plan: &Plan, reg: &str, with_broker: &dyn Fn(Command) -> Command) -> Result<Row, Failure> {
    const MEASURE: &str = "heartbeat timer resident set";
    let out = env.setup(with_broker(env.mam(&[
        "heartbeat",
        "start",
        "--registry-dir",
        reg,
        "--job-id",
        "bench",
        "--interval",
        "1",
        "--watch-pid",
        "0",
    ])))?;
    let pid: i32 = out.trim().parse().map_err(|_| fail("heartbeat start", format!("no pid in '{}'", out.trim())))?;
    sys::sleep(plan.timer_wait);
    let rss = sys::proc_rss_kib(pid);
    let anon = sys::proc_status_kib(pid, "RssAnon").unwrap_or(0);
    let stopped = env.setup(with_broker(env.mam(&["heartbeat", "stop", "--registry-dir", reg, "--job-id", "bench"])));
    let rss = rss.map_err(|e| fail("the timer's VmRSS", e))?;
    stopped?;
    let mut r = Row::new("timer_rss", MEASURE);
    r.now = Some(Qty::kib(rss));
    r.target = "<= 2.0 MiB".into();
    r.pass = Some(rss <= 2048);
    r.note = format!(
        "VmRSS after {:.1} s at 1 beat/s; its own memory (RssAnon) {} KiB, the rest shared file pages ({})",
        plan.timer_wait.as_secs_f64(),
        anon,
        if cfg!(target_feature = "crt-static") { "mam's code, glibc's linked in" } else { "mam's code, libc" }
    );
    if let Some(sleep) = &env.sleep_bin {
        let mut c = env.cmd(sleep, &["3600"]);
        let g = Guard(sys::spawn(&mut c).map_err(|e| fail("sleep", e))?);
        // Past its exec: the image is sleep's once /proc shows its name.
        measure::wait_until(Duration::from_secs(2), || {
            std::fs::read_to_string(format!("/proc/{}/comm", g.pid())).is_ok_and(|c| c.trim() == "sleep")
        });
        sys::sleep(Duration::from_millis(50));
        if let Ok(s) = sys::proc_rss_kib(g.pid()) {
            r.anchor = Some(("an idle sleep".into(), Qty::kib(s)));
            r.ratio = Some(rss as f64 / s.max(1) as f64);
        }
    }
    Ok(r)
}

/// `registry list`, `jobs` and `status` over a registry of `n` records: time and memory rows.
fn registry_rows(env: &Env, plan: &Plan, n: usize) -> Result<Vec<Row>, Failure> {
    let ws = env.dir.path.join(format!("registry-{n}"));
    sys::create_dir_all(&ws).map_err(|e| fail("registry fixture", e))?;
    fixture::workspace(&ws, n, clock::now_ms()).map_err(|e| fail("registry fixture", e))?;
    let runs = plan.registry_runs(n);
    let panes = ws.join("panes");
    let prep = |mut c: Command| {
        c.current_dir(&ws).env("MAM_PANE_BACKEND", "fake").env("MAM_FAKE_PANES_DIR", &panes);
        c
    };
    let mut list = prep(env.mam(&["registry", "list"]));
    let mut jobs = prep(env.mam(&["jobs"]));
    let mut status = prep(env.mam(&["status"]));
    let mut floor = prep(env.cmd(&env.true_bin, &[]));
    // `mam status` exits 3 when a server's state is unknown; the fake backend has none to ask.
    let s = measure::alternate(runs, &mut [&mut list, &mut jobs, &mut status, &mut floor])
        .map_err(|e| fail(&format!("registry of {n}"), e))?;
    let floor_kib = measure::max_rss_kib(&s[3]);
    let big = n >= 100_000;
    let mut rows = Vec::new();
    for (i, (name, id, time_max, rss_max)) in [
        ("mam registry list", "registry_list", None, Some(64)),
        ("mam jobs", "jobs", big.then_some(1000.0), big.then_some(32)),
        ("mam status", "status", None, None),
    ]
    .into_iter()
    .enumerate()
    {
        let ms = measure::median_ms(&s[i]);
        let mut t = Row::new(format!("{id}_{n}_time"), format!("{name}, {n} records: wall time"));
        t.now = Some(Qty::ms(ms));
        t.note = format!("{:.1} us per record, median of {runs}", ms * 1e3 / n as f64);
        if let Some(max) = time_max {
            t.target = format!("<= {:.0} ms", max);
            t.pass = Some(ms <= max);
        }
        let kib = measure::max_rss_kib(&s[i]);
        let mut m = Row::new(format!("{id}_{n}_rss"), format!("{name}, {n} records: peak resident set"));
        m.now = Some(Qty::kib(kib));
        m.note = format!("ru_maxrss; a process started here begins at {:.1} MiB", floor_kib as f64 / 1024.0);
        if let Some(max) = rss_max {
            m.target = format!("<= {max} MiB");
            m.pass = Some(kib <= max * 1024);
        }
        if id == "jobs" && !big {
            t.note.push_str("; the 1 s target is for 100,000 records");
            m.note.push_str("; the 32 MiB target is for 100,000 records");
        }
        rows.push(t);
        rows.push(m);
    }
    // Removed now rather than with the temp directory: 100,000 records hold 450 MB of disk.
    let _ = std::fs::remove_dir_all(&ws);
    Ok(rows)
}

/// Linear time: `registry list`'s time per record at the largest size against the next smaller.
fn growth_row(rows: &[Row], sizes: &[usize]) -> Option<Row> {
    let mut sorted = sizes.to_vec();
    crate::sort::natural(&mut sorted);
    sorted.dedup();
    let (&big, &small) = (sorted.last()?, sorted.get(sorted.len().checked_sub(2)?)?);
    let per = |n: usize| {
        let id = format!("registry_list_{n}_time");
        rows.iter().find(|r| r.id == id).and_then(|r| r.now).map(|q| q.value / n as f64)
    };
    let (b, s) = (per(big)?, per(small)?);
    let mut r =
        Row::new("registry_list_growth", format!("mam registry list: time per record, {big} vs {small} records"));
    r.now = Some(Qty::us(b * 1e3));
    r.anchor = Some((format!("at {small}"), Qty::us(s * 1e3)));
    r.ratio = Some(b / s);
    r.target = "<= 1.5 (linear)".into();
    r.pass = Some(b / s <= 1.5);
    r.note = "the ratio of the two, 1.0 for a cost that grows in proportion".into();
    Some(r)
}

// ---------------------------------------------------------------------------------------------
// The broker rows

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Mam => "mam broker",
            Kind::Mosquitto => "mosquitto",
        }
    }
}

/// A delivery scenario: the QoS, and whether the idle clients are connected during it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scenario {
    qos: u8,
    idle: bool,
}

/// One side's samples of one scenario or count, and its first failure.
#[derive(Debug)]
struct Side<T> {
    runs: Vec<T>,
    error: Option<String>,
}

impl<T> Default for Side<T> {
    fn default() -> Side<T> {
        Side { runs: Vec::new(), error: None }
    }
}

impl<T> Side<T> {
    fn record(&mut self, round: usize, r: Result<T, String>) {
        match r {
            Ok(v) => self.runs.push(v),
            Err(e) if self.error.is_none() => self.error = Some(format!("round {}: {e}", round + 1)),
            Err(_) => {}
        }
    }
}

/// A delivery run and the broker's CPU time over it.
#[derive(Debug, Clone, Copy)]
struct Run {
    d: load::Delivery,
    broker_cpu: Duration,
}

impl Run {
    fn broker_share(&self) -> f64 {
        self.broker_cpu.as_secs_f64() / self.d.wall.as_secs_f64().max(1e-9)
    }
}

/// Per side (`Kind as usize`): mam broker, then mosquitto.
type Sides<T> = [Side<T>; 2];

/// One delivery run against `b`, with the broker's CPU time (all its threads) over it.
fn timed_delivery(b: &Broker, qos: u8, n: usize, writes: load::Writes, limit: Duration) -> Result<Run, String> {
    let pid = b.guard.pid();
    let cpu = || sys::proc_cpu_ns(pid).map_err(|e| format!("the broker's CPU time: {e}"));
    let c0 = cpu()?;
    let d = load::delivery(b.addr(), qos, n, writes, limit).map_err(|e| format!("QoS {qos} delivery: {e}"))?;
    let c1 = cpu()?;
    Ok(Run { d, broker_cpu: Duration::from_nanos(c1.saturating_sub(c0)) })
}

/// VmRSS of `pid` once two reads 100 ms apart agree (at most 2 s).
fn settled_rss(pid: i32) -> Result<u64, String> {
    let read = || sys::proc_rss_kib(pid).map_err(|e| format!("VmRSS: {e}"));
    let end = Instant::now() + Duration::from_secs(2);
    let mut last = read()?;
    loop {
        sys::sleep(Duration::from_millis(100));
        let now = read()?;
        if now == last || Instant::now() >= end {
            return Ok(now);
        }
        last = now;
    }
}

/// The embedded broker against mosquitto: delivery at QoS 0, 1 and 2, resident set with idle
/// clients, delivery again beside the most idle clients, and the generator's own CPU. A broker or
/// generator failure leaves its rows unmeasured with the reason, and the rest of the table standing.
fn broker_rows(env: &Env, plan: &BrokerPlan) -> Vec<Row> {
    let limit = Duration::from_secs(30);
    let kinds: &[Kind] = if env.mosquitto.is_some() { &[Kind::Mam, Kind::Mosquitto] } else { &[Kind::Mam] };
    // Each idle client holds a descriptor here and one in the broker; mosquitto, spawned after,
    // inherits this limit (`mam broker` raises its own).
    let nofile = sys::raise_nofile_limit().ok().flatten();
    let fits = |n: usize| nofile.is_none_or(|l| l as usize >= n + 64);
    let idle_n = plan.clients.last().copied().unwrap_or(0);
    let mut plain: Vec<(Scenario, Sides<Run>)> =
        (0..=2).map(|qos| (Scenario { qos, idle: false }, Default::default())).collect();
    let mut idle: Vec<(Scenario, Sides<Run>)> = if idle_n > 0 {
        (0..=1).map(|qos| (Scenario { qos, idle: true }, Default::default())).collect()
    } else {
        Vec::new()
    };
    let mut rss: Vec<(usize, Sides<u64>)> = plan.clients.iter().map(|&n| (n, Default::default())).collect();
    let tools = fan_tools(env);
    let mut fans: Vec<(FanShape, Sides<FanRun>)> = FAN_SHAPES.iter().map(|&f| (f, Default::default())).collect();
    for round in 0..plan.rounds {
        let order: Vec<Kind> = if round % 2 == 0 { kinds.to_vec() } else { kinds.iter().rev().copied().collect() };
        for &k in &order {
            let b = start_broker(env, k).map_err(|f| f.line);
            for (sc, sides) in plain.iter_mut() {
                let r = b
                    .as_ref()
                    .map_err(Clone::clone)
                    .and_then(|b| timed_delivery(b, sc.qos, plan.messages, plan.writes, limit));
                sides[k as usize].record(round, r);
            }
            let Some(tools) = &tools else { continue };
            for (shape, sides) in fans.iter_mut() {
                let r = b.as_ref().map_err(Clone::clone).and_then(|b| timed_fan(b, tools, *shape, plan.fan_messages));
                sides[k as usize].record(round, r);
            }
        }
        if idle_n == 0 {
            continue;
        }
        for &k in &order {
            let b = start_broker(env, k).map_err(|f| f.line);
            let mut held = Vec::new();
            let mut connected = b.as_ref().map(|_| ()).map_err(Clone::clone);
            for (n, sides) in rss.iter_mut() {
                let n = *n;
                let r = connected.clone().and_then(|()| {
                    let b = b.as_ref().map_err(Clone::clone)?;
                    if !fits(n) {
                        return Err(format!(
                            "{n} idle clients need {} descriptors here, the open-files limit is {}",
                            n + 64,
                            nofile.unwrap_or_default()
                        ));
                    }
                    load::add_idle_clients(b.addr(), &mut held, n, limit).map_err(|e| e.to_string())?;
                    settled_rss(b.guard.pid())
                });
                if let Err(e) = &r {
                    connected = Err(e.clone());
                }
                sides[k as usize].record(round, r);
            }
            for (sc, sides) in idle.iter_mut() {
                let r = connected.clone().and_then(|()| {
                    let b = b.as_ref().map_err(Clone::clone)?;
                    timed_delivery(b, sc.qos, plan.messages, plan.writes, limit)
                });
                sides[k as usize].record(round, r);
            }
            drop(held);
            drop(b);
        }
    }
    let anchor = env.mosquitto.is_some();
    let mut rows = Vec::new();
    for (sc, sides) in plain.iter().chain(&idle) {
        rows.extend(delivery_rows(*sc, sides, plan, anchor, idle_n));
    }
    for (shape, sides) in &fans {
        rows.push(match &tools {
            Some(_) => fan_row(*shape, sides, plan, anchor),
            None => {
                Row::skipped(shape.id(), shape.measure(), ">= 1.0", "mosquitto_pub or mosquitto_sub is not installed")
            }
        });
    }
    for (n, sides) in &rss {
        rows.push(rss_row(*n, sides, plan, anchor));
    }
    rows.extend(generator_rows(plain.iter().chain(&idle).map(|(_, s)| s)));
    rows
}

/// What a side's failure or losses add to a row's note.
fn side_notes<T>(sides: &Sides<T>, anchor: bool, lost: impl Fn(&T) -> Option<usize>, sent: usize) -> String {
    let mut out = String::new();
    for k in [Kind::Mam, Kind::Mosquitto] {
        let s = &sides[k as usize];
        if k == Kind::Mosquitto && !anchor {
            out.push_str("; mosquitto is not installed: no anchor");
            continue;
        }
        for (i, l) in s.runs.iter().filter_map(&lost).enumerate().filter(|(_, l)| *l > 0) {
            out.push_str(&format!("; {} lost {l} of {sent} (run {})", k.name(), i + 1));
        }
        if let Some(e) = &s.error {
            out.push_str(&format!("; {} failed, {}", k.name(), crate::text::one_line(e)));
        }
    }
    out
}

/// Fills `r`'s value, anchor, ratio and verdict from the two sides' medians. `higher`: the
/// direction of the target (`None`: no target).
fn compare(r: &mut Row, mam: &[f64], mosq: &[f64], unit: fn(f64) -> Qty, higher: Option<bool>) {
    r.target = match higher {
        Some(true) => ">= 1.0".into(),
        Some(false) => "<= 1.0".into(),
        None => "-".into(),
    };
    if mam.is_empty() {
        return;
    }
    let now = measure::median(mam.to_vec());
    r.now = Some(unit(now));
    if mosq.is_empty() {
        return;
    }
    let a = measure::median(mosq.to_vec());
    let ratio = now / a.max(1e-12);
    r.anchor = Some(("mosquitto".into(), unit(a)));
    r.ratio = Some(ratio);
    r.pass = higher.map(|h| if h { ratio >= 1.0 } else { ratio <= 1.0 });
}

type Metric = (&'static str, &'static str, fn(&Run) -> f64, fn(f64) -> Qty, Option<bool>);

const METRICS: [Metric; 4] = [
    ("throughput", "throughput", |r| r.d.per_s, Qty::per_s, Some(true)),
    ("p50", "latency p50", |r| r.d.p50_ms, Qty::ms, Some(false)),
    ("p99", "latency p99", |r| r.d.p99_ms, Qty::ms, Some(false)),
    ("cpu", "broker CPU per message", |r| r.broker_cpu.as_secs_f64() * 1e6 / r.d.received.max(1) as f64, Qty::us, None),
];

/// A scenario's rows: throughput, p50, p99 (targets: at least mosquitto's), the broker's CPU per
/// message (for the record).
fn delivery_rows(sc: Scenario, sides: &Sides<Run>, plan: &BrokerPlan, anchor: bool, idle_n: usize) -> Vec<Row> {
    let q = sc.qos;
    let (prefix, what) = if sc.idle {
        (format!("broker_idle_q{q}"), format!("QoS {q}, {idle_n} idle clients"))
    } else {
        (format!("broker_q{q}"), format!("QoS {q}"))
    };
    let n = plan.messages;
    let notes = side_notes(sides, anchor, |r: &Run| Some(r.d.sent - r.d.received), n);
    let received = |k: Kind| sides[k as usize].runs.iter().map(|r| r.d.received).collect::<Vec<_>>();
    METRICS
        .iter()
        .map(|&(id, measure, f, unit, higher)| {
            let vals = |k: Kind| sides[k as usize].runs.iter().map(f).collect::<Vec<f64>>();
            let mut r = Row::new(format!("{prefix}_{id}"), format!("broker {what}: {measure}"));
            compare(&mut r, &vals(Kind::Mam), &vals(Kind::Mosquitto), unit, higher);
            r.note = format!(
                "{n} messages of {} bytes, medians of {} alternating rounds{notes}",
                load::PAYLOAD,
                sides[Kind::Mam as usize].runs.len()
            );
            r.detail = Some(serde_json::json!({
                "sent": n,
                "mam": vals(Kind::Mam),
                "mosquitto": vals(Kind::Mosquitto),
                "received": {"mam": received(Kind::Mam), "mosquitto": received(Kind::Mosquitto)},
            }));
            r
        })
        .collect()
}

/// A fan run: how many `mosquitto_pub -l` publishers and `mosquitto_sub` subscribers.
#[derive(Debug, Clone, Copy)]
struct FanShape {
    pubs: usize,
    subs: usize,
}

/// Fan-in from 1, 2, 4, 8 and 32 publishers to one subscriber, fan-out from one to 8 (issue 31).
const FAN_SHAPES: [FanShape; 6] = [
    FanShape { pubs: 1, subs: 1 },
    FanShape { pubs: 2, subs: 1 },
    FanShape { pubs: 4, subs: 1 },
    FanShape { pubs: 8, subs: 1 },
    FanShape { pubs: 32, subs: 1 },
    FanShape { pubs: 1, subs: 8 },
];

impl FanShape {
    fn id(self) -> String {
        if self.subs == 1 {
            format!("broker_fanin_{}", self.pubs)
        } else {
            format!("broker_fanout_{}", self.subs)
        }
    }

    fn measure(self) -> String {
        format!(
            "broker fan-{}: {} mosquitto_pub -l -> {} mosquitto_sub, QoS 1: deliveries per second",
            if self.subs == 1 { "in" } else { "out" },
            self.pubs,
            self.subs
        )
    }
}

/// A fan run and the broker's CPU time over it.
#[derive(Debug, Clone, Copy)]
struct FanRun {
    f: fan::Fan,
    broker_cpu: Duration,
}

fn fan_tools(env: &Env) -> Option<fan::Tools> {
    Some(fan::Tools {
        publisher: env.mosquitto_pub.clone()?,
        subscriber: env.mosquitto_sub.clone()?,
        dir: env.dir.path.clone(),
        env: env.base_env.clone(),
    })
}

fn timed_fan(b: &Broker, tools: &fan::Tools, shape: FanShape, n: usize) -> Result<FanRun, String> {
    let pid = b.guard.pid();
    let cpu = || sys::proc_cpu_ns(pid).map_err(|e| format!("the broker's CPU time: {e}"));
    let c0 = cpu()?;
    let f = fan::fan(tools, b.addr(), shape.pubs, shape.subs, n, Duration::from_secs(120))
        .map_err(|e| format!("{}: {e}", shape.id()))?;
    let c1 = cpu()?;
    Ok(FanRun { f, broker_cpu: Duration::from_nanos(c1.saturating_sub(c0)) })
}

fn fan_row(shape: FanShape, sides: &Sides<FanRun>, plan: &BrokerPlan, anchor: bool) -> Row {
    let vals = |k: Kind| sides[k as usize].runs.iter().map(|r| r.f.per_s()).collect::<Vec<f64>>();
    let mut r = Row::new(shape.id(), shape.measure());
    compare(&mut r, &vals(Kind::Mam), &vals(Kind::Mosquitto), Qty::per_s, Some(true));
    let lost = |x: &FanRun| Some(x.f.due.saturating_sub(x.f.delivered));
    let due = shape.pubs * shape.subs * plan.fan_messages;
    let mut dups = String::new();
    for k in [Kind::Mam, Kind::Mosquitto] {
        let d: usize = sides[k as usize].runs.iter().map(|x| x.f.duplicates).sum();
        if d > 0 {
            dups.push_str(&format!("; {} delivered {d} duplicates", k.name()));
        }
    }
    r.note = format!(
        "{} lines per publisher, each due once at each subscriber, medians of {} alternating rounds{}{dups}",
        plan.fan_messages,
        sides[Kind::Mam as usize].runs.len(),
        side_notes(sides, anchor, lost, due)
    );
    let col = |k: Kind, f: &dyn Fn(&FanRun) -> f64| sides[k as usize].runs.iter().map(f).collect::<Vec<f64>>();
    r.detail = Some(serde_json::json!({
        "due": due,
        "mam": vals(Kind::Mam),
        "mosquitto": vals(Kind::Mosquitto),
        "duplicates": {"mam": col(Kind::Mam, &|x| x.f.duplicates as f64), "mosquitto": col(Kind::Mosquitto, &|x| x.f.duplicates as f64)},
        "broker_cpu_s": {"mam": col(Kind::Mam, &|x| x.broker_cpu.as_secs_f64()), "mosquitto": col(Kind::Mosquitto, &|x| x.broker_cpu.as_secs_f64())},
    }));
    r
}

fn rss_row(n: usize, sides: &Sides<u64>, plan: &BrokerPlan, anchor: bool) -> Row {
    let vals = |k: Kind| sides[k as usize].runs.iter().map(|&kib| kib as f64).collect::<Vec<f64>>();
    let mut r = Row::new(format!("broker_rss_{n}"), format!("broker: resident set with {n} idle clients"));
    compare(&mut r, &vals(Kind::Mam), &vals(Kind::Mosquitto), |kib| Qty::kib(kib as u64), Some(false));
    r.note = format!(
        "VmRSS, each client connected and subscribed to a topic of its own, medians of {} of {} rounds{}",
        sides[Kind::Mam as usize].runs.len(),
        plan.rounds,
        side_notes(sides, anchor, |_| None, n)
    );
    r.detail = Some(serde_json::json!({"mam_kib": vals(Kind::Mam), "mosquitto_kib": vals(Kind::Mosquitto)}));
    r
}

/// The load generator's own CPU in every delivery run, one row per broker: its busier thread's
/// share of one core, the median of the runs (the largest in the note). The target is on the
/// mosquitto runs: there it must stay well below a core for the anchor's numbers to be mosquitto's
/// and not the generator's (where the generator is what bounds `mam broker`, its ratios understate
/// it); the mam row is for the record.
fn generator_rows<'a>(all: impl Iterator<Item = &'a Sides<Run>>) -> Vec<Row> {
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for sides in all {
        for k in [Kind::Mam, Kind::Mosquitto] {
            runs[k as usize].extend(sides[k as usize].runs.iter().copied());
        }
    }
    [(Kind::Mosquitto, "broker_generator_cpu", "<= 50%"), (Kind::Mam, "broker_generator_cpu_mam", "-")]
        .into_iter()
        .map(|(k, id, target)| {
            let measure = format!("load generator, {} runs: its busier thread's CPU", k.name());
            let runs = &runs[k as usize];
            if runs.is_empty() {
                return Row::skipped(id, measure, target, format!("no delivery run against {} completed", k.name()));
            }
            let max = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).fold(0.0, f64::max);
            let per_core = |cpu: Duration, r: &Run| cpu.as_secs_f64() / r.d.wall.as_secs_f64().max(1e-9);
            let busiest = measure::median(runs.iter().map(|r| r.d.busiest_thread()).collect());
            let mut r = Row::new(id, measure);
            r.now = Some(Qty::percent(busiest));
            if target != "-" {
                r.target = target.into();
                r.pass = Some(busiest <= 0.5);
            }
            r.note = format!(
                "share of one core, median of {} runs; the largest: the busier thread {:.0}%, the publisher \
                 thread {:.0}%, the subscriber thread {:.0}%, both together {:.2} cores; the broker's own CPU \
                 in those runs: median {:.0}% of a core",
                runs.len(),
                max(&|r| r.d.busiest_thread()) * 100.0,
                max(&|r| per_core(r.d.publisher_cpu, r)) * 100.0,
                max(&|r| per_core(r.d.subscriber_cpu, r)) * 100.0,
                max(&|r| r.d.generator_cores()),
                measure::median(runs.iter().map(Run::broker_share).collect()) * 100.0,
            );
            let col = |f: &dyn Fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<f64>>();
            r.detail = Some(serde_json::json!({
                "busiest_thread": col(&|r| r.d.busiest_thread()),
                "publisher": col(&|r| per_core(r.d.publisher_cpu, r)),
                "subscriber": col(&|r| per_core(r.d.subscriber_cpu, r)),
                "broker": col(&Run::broker_share),
            }));
            r
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// publish: the breakdown

fn publish_breakdown(ctx: &Ctx, runs: usize, json: bool) -> Result<i32, Failure> {
    let env = make_env(ctx)?;
    let load_start = measure::loadavg();
    let broker = start_broker(&env, if env.mosquitto.is_some() { Kind::Mosquitto } else { Kind::Mam })?;
    let (reg, payload) = publish_job(&env, &broker, &env.dir.path)?;
    let port = broker.port.to_string();
    let mut publish = env.mam(&["publish", "--registry-dir", &reg, "--job-id", "bench", "--event", "progress"]);
    publish.env("MQTT_BROKER", "127.0.0.1").env("MQTT_PORT", &port).env("MAM_TRACE", "1").stderr(Stdio::piped());
    let mut anchor = env.mosquitto_pub.as_ref().map(|mp| {
        env.cmd(mp, &["-h", "127.0.0.1", "-p", &port, "-q", "1", "-t", "mam/jobs/bench/events", "-m", &payload])
    });
    let (mut walls, mut anchors) = (Vec::new(), Vec::new());
    // Per step: the starts and lengths seen, in the order the steps first appeared.
    let mut steps: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut ends = Vec::new();
    for round in 0..runs {
        let one = |c: &mut Command| -> Result<(f64, String), Failure> {
            let t = Instant::now();
            let mut child = sys::spawn(c).map_err(|e| fail(&measure::shown(c), e))?;
            let mut err = String::new();
            if let Some(mut s) = child.stderr.take() {
                use std::io::Read;
                let _ = s.read_to_string(&mut err);
            }
            let (code, _) = sys::wait_rusage(child.id() as i32).map_err(|e| fail(&measure::shown(c), e))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if code != 0 {
                return Err(fail(
                    &measure::shown(c),
                    format!("exited with {code}: {}", err.lines().next().unwrap_or("")),
                ));
            }
            Ok((ms, err))
        };
        let mut run_anchor = |walls: &mut Vec<f64>| -> Result<(), Failure> {
            if let Some(a) = anchor.as_mut() {
                walls.push(one(a)?.0);
            }
            Ok(())
        };
        if round % 2 == 1 {
            run_anchor(&mut anchors)?;
        }
        let (ms, err) = one(&mut publish)?;
        walls.push(ms);
        let spans = err.lines().find_map(crate::trace::parse).ok_or_else(|| fail("publish", "no mam-trace line"))?;
        ends.push(spans.iter().map(|(_, s, l)| s + l).fold(0.0, f64::max));
        for (name, start, len) in spans {
            match steps.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, s, l)) => {
                    s.push(start);
                    l.push(len);
                }
                None => steps.push((name, vec![start], vec![len])),
            }
        }
        if round % 2 == 0 {
            run_anchor(&mut anchors)?;
        }
    }
    drop(broker);
    let wall = measure::median(walls);
    let inside = measure::median(ends);
    let anchor = (!anchors.is_empty()).then(|| measure::median(anchors));
    let load_end = measure::loadavg();
    let rows: Vec<(String, f64, f64)> =
        steps.into_iter().map(|(n, s, l)| (n, measure::median(s), measure::median(l))).collect();
    if json {
        let v = serde_json::json!({
            "command": "mam bench publish",
            "runs": runs,
            "load_start": load_start,
            "load_end": load_end,
            "broker": if env.mosquitto.is_some() { "mosquitto" } else { "mam broker" },
            "steps": rows.iter().map(|(n, s, l)| serde_json::json!({"step": n, "start_ms": s, "ms": l})).collect::<Vec<_>>(),
            "traced_ms": inside,
            "wall_ms": wall,
            "outside_ms": wall - inside,
            "mosquitto_pub_ms": anchor,
        });
        ctx.say(&serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let load = |l: Option<[f64; 3]>| l.map_or("unknown".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"));
    let broker_name = if env.mosquitto.is_some() { "mosquitto" } else { "mam broker" };
    let mut out = format!(
        "mam bench publish: {runs} runs of `mam publish --event progress` (MAM_TRACE=1) to {broker_name}, \
         registry under {}; load {} at the start, {} at the end\n\n{:<12} {:>9} {:>9}\n",
        show_path(&env.dir.path),
        load(load_start),
        load(load_end),
        "step",
        "start ms",
        "ms"
    );
    for (n, s, l) in &rows {
        out.push_str(&format!("{n:<12} {s:>9.3} {l:>9.3}\n"));
    }
    out.push_str(&format!(
        "\nwhole process {wall:.3} ms (median): {inside:.3} ms in the steps above, {:.3} ms outside them \
         (exec, loading, exit)\n",
        wall - inside
    ));
    match anchor {
        Some(a) => out.push_str(&format!("mosquitto_pub -q 1 {a:.3} ms: ratio {:.2}\n", wall / a)),
        None => out.push_str("mosquitto_pub is not installed: no anchor\n"),
    }
    ctx.say_raw(out.as_bytes());
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// loop-round

/// What every repetition shares: the repository, the base, the control plane left out, the
/// binary whose diff-collect runs, the loop dir (a temp dir), and the checkpoint of a loop that
/// has dispatched its creator.
struct Bench<'a> {
    ctx: &'a Ctx,
    root: PathBuf,
    control: PathBuf,
    base: String,
    exclude: Vec<PathBuf>,
    exe: PathBuf,
    /// The registry and audit-log root, which the diff leaves out (as the loop's do).
    registry: PathBuf,
    logs: PathBuf,
    /// `MAM_LOOP_DIFF_MAX_BYTES`, read as `mam loop` reads it.
    diff_max: u32,
    dir: TempDir,
    cp: Checkpoint,
}

impl<'a> Bench<'a> {
    fn new(ctx: &'a Ctx, repo: &Path, base_ref: &str) -> Result<Bench<'a>, Failure> {
        let root = git::toplevel(ctx, repo).map_err(|e| fail("repo", e))?;
        let base = git::resolve_commit(ctx, &root, base_ref).map_err(|e| fail("base", e))?;
        let r = paths::resolve_unchecked(ctx, None);
        // As `mam loop` leaves them out (review::run).
        let mut exclude = vec![r.control_root.join(".mam"), r.registry.clone(), r.logs.clone()];
        if root != r.control_root {
            exclude.push(root.join(".mam"));
        }
        let exe = std::env::current_exe().map_err(|e| fail("this binary", e))?;
        let dir = TempDir::create(ctx, "mam-bench").map_err(|e| fail("loop dir", show_path(&e.path)))?;
        for sub in ["review", "prompts", "tmp"] {
            sys::create_dir_all(&dir.path.join(sub)).map_err(|e| fail("loop dir", e))?;
        }
        let now = clock::now_ts();
        let cp = Checkpoint {
            loop_id: "0bench00".into(),
            framework_version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            control_root: r.control_root.display().to_string(),
            source_root: root.display().to_string(),
            registry: r.registry.display().to_string(),
            base: Some(base.clone()),
            base_origin: Some(format!("--base {base_ref}")),
            creator: "creator".into(),
            creator_jid: "j-bench-creator".into(),
            reviewers: vec!["reviewer".into()],
            phase: "review".into(),
            round: 1,
            max_rounds: 3,
            plan_path: None,
            collector: exe.display().to_string(),
            started_at: now.clone(),
            updated_at: now.clone(),
            wall_clock_s: 14400,
            jobs: vec![job_row("j-bench-creator", "implementer", 0, &now)],
            review_rounds: Vec::new(),
            promoted: Vec::new(),
            outcome: None,
            reason: None,
            rc: None,
        };
        let diff_max = knob::env_or(ctx, "MAM_LOOP_DIFF_MAX_BYTES", 1, diffcollect::DEFAULT_MAX_BYTES)?;
        Ok(Bench {
            ctx,
            root,
            control: r.control_root,
            base,
            exclude,
            exe,
            registry: r.registry,
            logs: r.logs,
            diff_max,
            dir,
            cp,
        })
    }

    /// One round's steps, each as (name, milliseconds).
    fn round(&self, rep: u32) -> Result<Vec<(&'static str, f64)>, Failure> {
        let ctx = self.ctx;
        let mut cp = self.cp.clone();
        let mut laps = Laps { t: Instant::now(), steps: Vec::new(), checkpoint_ms: 0.0 };
        self.save(&mut laps, &mut cp)?;
        let mut repo = Repo { root: self.root.clone(), exclude: self.exclude.clone() };
        let snap = repo.pin(ctx, &cp.loop_id).map_err(|e| fail("pin", e))?;
        laps.lap("pin");
        match repo.guard(ctx, &self.base, &snap.commit) {
            DiffGuard::Changes => {}
            DiffGuard::Empty => return Err(fail("guard", "nothing changed since the base")),
            DiffGuard::Undeterminable(why) => return Err(fail("guard", why)),
        }
        laps.lap("guard");
        let tmp = ctx.path_var("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
        let tree = tmp.join(format!("mam-review-{}-{}-r{rep}", cp.loop_id, std::process::id()));
        git::add_review_tree(ctx, &self.root, &tree, &snap.commit).map_err(|e| fail("tree", e))?;
        repo.exclude.push(tree.clone());
        laps.lap("tree");
        let result = self.in_tree(rep, &repo, &snap, &tree, &mut laps, &mut cp);
        laps.t = Instant::now();
        let removed = git::remove_review_tree(ctx, &self.root, &tree).map_err(|e| fail("remove", e));
        laps.lap("remove");
        result?;
        removed?;
        laps.steps.push(("checkpoint", laps.checkpoint_ms));
        Ok(laps.steps)
    }

    /// A checkpoint write, timed apart from the step around it.
    fn save(&self, laps: &mut Laps, cp: &mut Checkpoint) -> Result<(), Failure> {
        let t = Instant::now();
        cp.updated_at = clock::now_ts();
        cp.write(&self.dir.path.join("checkpoint.json")).map_err(|e| fail("checkpoint", e))?;
        laps.checkpoint_ms += ms_since(t);
        laps.t = Instant::now();
        Ok(())
    }

    /// The steps while the review tree exists (the caller removes it whatever they return).
    fn in_tree(
        &self,
        rep: u32,
        repo: &Repo,
        snap: &git::Snapshot,
        tree: &Path,
        laps: &mut Laps,
        cp: &mut Checkpoint,
    ) -> Result<(), Failure> {
        let ctx = self.ctx;
        let dir = &self.dir.path;

        // The diff, from a child, as the loop runs its frozen copy.
        let diff_path = dir.join("review").join(format!("r{rep}.diff"));
        let tmp = dir.join("tmp");
        let child = diffcollect::Child {
            exe: &self.exe,
            control: &self.control,
            source: &self.root,
            base: &self.base,
            snapshot: &snap.commit,
            registry: &self.registry,
            logs: &self.logs,
            tmp: &tmp,
            max_bytes: self.diff_max,
        };
        let out = diffcollect::child_command(ctx, &child).output().map_err(|e| fail("diff", e))?;
        if !out.status.success() || !out.stdout.starts_with(b"# mam diff-collect: ") {
            let first = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("no output").to_string();
            return Err(fail("diff", first));
        }
        sys::atomic_write(&diff_path, &out.stdout).map_err(|e| fail("diff", e))?;
        laps.lap("diff");

        // The reviewer's prompt: the context facts, the blocks, the body, and the dispatch's files.
        let head = git::head(ctx, &self.root).unwrap_or_default();
        let facts = prompt::Context {
            path: tree.display().to_string(),
            branch: git::branch(ctx, &self.root).ok().flatten(),
            commits: git::count_commits(ctx, &self.root, &self.base, &head).unwrap_or(0),
            head,
            base: self.base.clone(),
            base_origin: "--base".into(),
            uncommitted: repo.has_uncommitted(ctx).unwrap_or(true),
        };
        let mut context = prompt::context_block(&facts);
        context.push_str(&prompt::identity_block(&prompt::Identity {
            loop_id: cp.loop_id.clone(),
            base: self.base.clone(),
            head: snap.head.clone(),
            tree: snap.tree.clone(),
            snapshot_commit: snap.commit.clone(),
        }));
        let body = prompt::review(&prompt::Review {
            round: rep,
            task: None,
            change: prompt::Change::DiffFile {
                diff: diff_path.display().to_string(),
                tree: tree.display().to_string(),
            },
            subjobs: None,
            challenged: &[],
            pinned: true,
            own: false,
            env_tmpdir: None,
        });
        let prompts = dir.join("prompts");
        for (name, text) in [(format!("{rep:02}-review.md"), &body), (format!("{rep:02}-review.context.md"), &context)]
        {
            sys::atomic_write(&prompts.join(name), text.as_bytes()).map_err(|e| fail("prompt", e))?;
        }
        laps.lap("prompt");
        let jid = format!("j-bench-r{rep}");
        cp.jobs.push(job_row(&jid, "reviewer", rep, &clock::now_ts()));
        self.save(laps, cp)?;

        // The agent would run here; its report is written untimed, then read back and judged.
        let report_path = dir.join(format!("{jid}.report.md"));
        let report = format!("Looked at the diff.\n\nIDENTITY: {}\nVERDICT: PASS\n", snap.tree);
        sys::atomic_write(&report_path, report.as_bytes()).map_err(|e| fail("judge", e))?;
        laps.t = Instant::now();
        let bytes = checkpoint::read_bounded(&report_path, 1 << 20).map_err(|e| fail("judge", e))?;
        let report = String::from_utf8_lossy(&bytes).into_owned();
        let j = evidence::judge(&report, Some(&snap.tree), false);
        if j.verdict != Verdict::Pass {
            return Err(fail("judge", j.synthetic.unwrap_or_default()));
        }
        laps.lap("judge");
        let t = Instant::now();
        let copy = dir.join("review").join(format!("r{rep}-reviewer.md"));
        sys::atomic_write(&copy, report.as_bytes()).map_err(|e| fail("checkpoint", e))?;
        laps.checkpoint_ms += ms_since(t);
        if let Some(row) = cp.jobs.last_mut() {
            row.status = "completed".into();
            row.report = Some(copy.display().to_string());
        }
        self.save(laps, cp)?;

        // Re-measure: the source must not have changed during the review.
        let now = repo.fingerprint(ctx).map_err(|e| fail("remeasure", e))?;
        if now.head != snap.head || now.tree != snap.tree {
            return Err(fail("remeasure", "the repository changed during the benchmark"));
        }
        laps.lap("remeasure");
        cp.review_rounds.push(Round {
            round: rep,
            kind: "review".into(),
            identity: Some(RoundIdentity {
                loop_id: cp.loop_id.clone(),
                base: self.base.clone(),
                head: snap.head.clone(),
                tree: snap.tree.clone(),
            }),
            snapshot_commit: Some(snap.commit.clone()),
            isolation: "tree".into(),
            stale: false,
            diff: Some(diff_path.display().to_string()),
            reviewers: vec![ReviewerRow {
                session: "reviewer".into(),
                jid,
                transport: "local".into(),
                evidence: "review-tree".into(),
                verdict: Some(j.verdict.as_str().into()),
                synthetic: None,
                report: Some(copy.display().to_string()),
            }],
        });
        self.save(laps, cp)
    }
}

/// The steps timed so far; `t` is where the current step began. Checkpoint writes are summed apart.
struct Laps {
    t: Instant,
    steps: Vec<(&'static str, f64)>,
    checkpoint_ms: f64,
}

impl Laps {
    fn lap(&mut self, name: &'static str) {
        self.steps.push((name, ms_since(self.t)));
        self.t = Instant::now();
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn job_row(jid: &str, role: &str, round: u32, now: &str) -> JobRow {
    JobRow {
        jid: jid.into(),
        role: role.into(),
        kind: "loop".into(),
        session: if role == "implementer" { "creator" } else { "reviewer" }.into(),
        round,
        status: "dispatched".into(),
        report: None,
        dispatched_at: now.into(),
    }
}
