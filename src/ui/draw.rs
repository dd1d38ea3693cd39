//! What `mam ui` draws (issue 22): the whole screen as exactly `h` lines of exactly `w` cells,
//! from the `World`, the `App` and the clock. The list: a header (counts, the filter), the
//! sessions, jobs and loops sections (each with its column titles, each scrolled so the selection
//! is visible; columns are cut, then dropped, to fit 80 columns), and a footer (the broker and the
//! registry, or the message, the filter being typed, the stop confirmation). Also the key help and
//! the text view. Finished jobs are dim, silent ones bold red with how long; a live job's evidence
//! bar fills as its idle window runs out.
//!
//! Pure: the drawing only updates the App's scroll offsets and page size.

use std::collections::BTreeMap;

use crate::clock;
use crate::joblog::Waiting;
use crate::ui::app::{shown, App, Mode, Shown};
use crate::ui::cells::{clip, clip_left, fit, width, Line, Style};
use crate::view::jobs::{age, Row};
use crate::view::world::{Bus, LoopView, SessionView, World};

const RED: u8 = 31;
const GREEN: u8 = 32;
const YELLOW: u8 = 33;
const CYAN: u8 = 36;

/// The cells of the evidence bar.
const BAR: usize = 6;

/// The key help, one key a line.
pub const KEYS: &[(&str, &str)] = &[
    ("up/down, j/k", "move the selection"),
    ("PgUp/PgDn, g/G", "a page up or down, the first or last row"),
    ("Enter", "go to the session's pane (a job's or loop's session)"),
    ("r", "the job's report (a session or loop: its newest job's)"),
    ("l", "the job's events.log, followed as it grows"),
    ("s", "stop the session or cancel the job (asks first)"),
    ("/", "filter the rows (Enter keeps it, Esc clears it)"),
    ("?", "this help"),
    ("q, Ctrl-C", "quit (in a report or log: q or Esc goes back)"),
];

/// One column: its title, its narrowest and widest, and the order in which it is dropped when the
/// screen is too narrow (0: never).
struct Col {
    title: &'static str,
    min: usize,
    max: usize,
    drop: u8,
}

impl Col {
    /// A column that is never dropped.
    const fn kept(title: &'static str, min: usize, max: usize) -> Col {
        Col { title, min, max, drop: 0 }
    }

    /// A column dropped when the screen is too narrow, rank 1 first.
    const fn dropped(title: &'static str, min: usize, max: usize, rank: u8) -> Col {
        Col { title, min, max, drop: rank }
    }
}

/// The width of each column for `rows` in `w` cells (after the 2-cell selection marker, one space
/// between columns); 0 for a dropped column. The last kept column takes what is left.
fn widths(cols: &[Col], rows: &[Vec<String>], w: usize) -> Vec<usize> {
    let mut want: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let content = rows.iter().map(|r| width(&r[i])).max().unwrap_or(0);
            content.max(width(c.title)).clamp(c.min, c.max)
        })
        .collect();
    let avail = w.saturating_sub(2);
    let total = |v: &[usize]| {
        let kept: Vec<&usize> = v.iter().filter(|&&x| x > 0).collect();
        kept.iter().copied().sum::<usize>() + kept.len().saturating_sub(1)
    };
    // Shrink the widest columns first, down to their minimum.
    while total(&want) > avail {
        let Some(i) = (0..cols.len()).filter(|&i| want[i] > cols[i].min).max_by_key(|&i| want[i] - cols[i].min) else {
            break;
        };
        want[i] -= 1;
    }
    // Then drop columns in their order.
    let mut order: Vec<usize> = (0..cols.len()).filter(|&i| cols[i].drop > 0).collect();
    crate::sort::by_key(&mut order, |&i| cols[i].drop);
    for i in order {
        if total(&want) <= avail {
            break;
        }
        want[i] = 0;
    }
    // The last kept column takes the rest (or is cut to it).
    if let Some(last) = (0..cols.len()).rev().find(|&i| want[i] > 0) {
        let others = total(&want) - want[last];
        want[last] = avail.saturating_sub(others + usize::from(others > 0));
    }
    want
}

/// One table row: the cells laid out in `ws`, each in its style.
fn row_line(cells: &[(String, Style)], ws: &[usize], selected: bool, base: Style) -> Line {
    let mut l = Line { spans: Vec::new(), reverse: selected };
    l.push(if selected { Style::BOLD } else { base }, if selected { "> " } else { "  " });
    let mut first = true;
    for ((text, style), &cw) in cells.iter().zip(ws) {
        if cw == 0 {
            continue;
        }
        if !first {
            l.push(base, " ");
        }
        first = false;
        l.push(*style, fit(text, cw));
    }
    l
}

fn title_line(name: &str, cols: &[Col], ws: &[usize], w: usize, range: Option<(usize, usize, usize)>) -> Line {
    let mut l = Line::default();
    l.push(Style::BOLD, "  ");
    let mut first = true;
    for (i, (c, &cw)) in cols.iter().zip(ws).enumerate() {
        if cw == 0 {
            continue;
        }
        if !first {
            l.push(Style::PLAIN, " ");
        }
        first = false;
        let t = if i == 0 { name } else { c.title };
        l.push(Style { bold: true, fg: Some(CYAN), ..Style::PLAIN }, fit(t, cw));
    }
    if let Some((a, b, n)) = range {
        // The scroll position goes at the right end: in the room the titles leave, else over them.
        let tag = format!(" {a}-{b} of {n} ");
        let text = l.text();
        let tw = width(&tag);
        let keep = width(text.trim_end()).min(w.saturating_sub(tw));
        let mut m = Line::default();
        m.push(Style { bold: true, fg: Some(CYAN), ..Style::PLAIN }, fit(&text, keep));
        m.push(Style::PLAIN, " ".repeat(w.saturating_sub(keep + tw)));
        m.push(Style::DIM, tag);
        return m;
    }
    l
}

fn secs(ms: u64) -> String {
    age(Some(0), ms)
}

/// The evidence cell: `age/window` and a bar that fills as the window runs out.
fn evidence_cell(r: &Row, now: u64) -> (String, Style) {
    if r.finished() {
        return ("-".into(), Style::DIM);
    }
    if r.status() == "pending" {
        return ("-".into(), Style::PLAIN); // not handed to an agent yet: no window runs
    }
    let Some(ev) = r.evidence_ms.get().or(r.started_ms.get()) else { return ("-".into(), Style::PLAIN) };
    let since = now.saturating_sub(ev);
    let frac = if r.idle_ms == 0 { 1.0 } else { since as f64 / r.idle_ms as f64 };
    let filled = ((frac * BAR as f64).ceil() as usize).min(BAR);
    let silent = r.silent_ms(now).is_some();
    let bar: String = if silent { "!".repeat(BAR) } else { "#".repeat(filled) + &".".repeat(BAR - filled) };
    let color = if silent {
        RED
    } else if frac >= 0.5 {
        YELLOW
    } else {
        GREEN
    };
    (format!("{}/{} {bar}", age(Some(ev), now), secs(r.idle_ms)), Style::fg(color))
}

fn job_cells(r: &Row, waiting: Option<&Waiting>, now: u64) -> (Vec<(String, Style)>, Style) {
    let silent = r.silent_ms(now);
    let base = if r.finished() {
        Style::DIM
    } else if silent.is_some() {
        Style { bold: true, fg: Some(RED), ..Style::PLAIN }
    } else {
        Style::PLAIN
    };
    let verdict = match silent {
        _ if !r.finished() && waiting.is_some() => {
            let text = waiting.map(|w| w.text(now)).unwrap_or_default();
            (text, Style { bold: true, fg: Some(YELLOW), ..Style::PLAIN })
        }
        Some(ms) => (format!("SILENT {}", secs(ms)), Style { bold: true, fg: Some(RED), ..Style::PLAIN }),
        None if r.finished() => (r.reason().unwrap_or("-").to_string(), base),
        None if r.status() == "pending" => ("queued".into(), base),
        None => ("alive".into(), Style::fg(GREEN)),
    };
    let (hb, elapsed) = if r.finished() {
        ("-".to_string(), r.elapsed_ms(now).map_or("-".into(), secs))
    } else {
        (age(r.heartbeat_ms.get(), now), r.elapsed_ms(now).map_or("-".into(), secs))
    };
    let (ev, ev_style) = evidence_cell(r, now);
    let session = if r.session().is_empty() { "-" } else { r.session() };
    let cells = vec![
        (r.job_id().to_string(), base),
        (r.status().to_string(), base),
        (session.to_string(), base),
        (elapsed, base),
        (ev, if r.finished() { base } else { ev_style }),
        (hb, base),
        verdict,
    ];
    (cells, base)
}

const JOB_COLS: &[Col] = &[
    Col::kept("JOB", 8, 12),
    Col::kept("STATUS", 7, 16),
    Col::kept("SESSION", 6, 20),
    Col::dropped("ELAPSED", 5, 7, 2),
    Col::dropped("EVIDENCE/IDLE", 13, 20, 3),
    Col::dropped("HB", 3, 6, 1),
    Col::kept("VERDICT", 6, 40),
];

const SESSION_COLS: &[Col] = &[
    Col::kept("SESSIONS", 8, 20),
    Col::dropped("AGENT", 4, 8, 2),
    Col::dropped("PANE", 6, 26, 3),
    Col::kept("STATE", 5, 8),
    Col::kept("OPEN JOB", 8, 22),
    Col::dropped("AGE", 3, 6, 1),
];

const LOOP_COLS: &[Col] = &[
    Col::kept("LOOPS", 8, 8),
    Col::kept("STATE", 6, 12),
    Col::dropped("PHASE", 5, 9, 3),
    Col::kept("ROUND", 5, 7),
    Col::dropped("CREATOR", 6, 16, 2),
    Col::kept("REVIEWERS", 8, 40),
    Col::dropped("PROMOTED", 3, 30, 1),
];

type Cells = (Vec<(String, Style)>, Style);

fn session_cells(s: &SessionView, now: u64) -> Cells {
    let gone = matches!(s.state.as_str(), "gone" | "stopped" | "unknown");
    let base = if gone { Style::DIM } else { Style::PLAIN };
    let state_style = match s.state.as_str() {
        "working" => Style::fg(GREEN),
        "waiting" => Style { bold: true, fg: Some(YELLOW), ..Style::PLAIN },
        "gone" | "unknown" => Style::fg(RED),
        _ => base,
    };
    // The pane id first (issue 32 item 6): a narrow column cuts the server's name, never the id.
    let pane =
        if s.backend == "remote" { "remote".to_string() } else { format!("{} {}:{}", s.pane, s.backend, s.server) };
    let (job, job_age) = match &s.job {
        Some((id, st, since)) => (format!("{id} {st}"), age(*since, now)),
        None => ("-".to_string(), "-".to_string()),
    };
    let agent = if s.agent.is_empty() { "-".to_string() } else { s.agent.clone() };
    (
        vec![
            (s.name.clone(), base),
            (agent, base),
            (pane, base),
            (s.state.clone(), state_style),
            (job, base),
            (job_age, base),
        ],
        base,
    )
}

fn loop_cells(l: &LoopView) -> Cells {
    let base = if l.finished { Style::DIM } else { Style::PLAIN };
    let reviewers = if l.reviewers.is_empty() {
        "self-review".to_string()
    } else {
        l.reviewers.iter().map(|(s, v)| format!("{s} {v}")).collect::<Vec<_>>().join(", ")
    };
    let promoted = if l.promoted.is_empty() {
        "-".to_string()
    } else {
        l.promoted.iter().map(|p| p.rsplit('/').next().unwrap_or(p).to_string()).collect::<Vec<_>>().join(", ")
    };
    let state_style = match l.state.as_str() {
        "running" => Style::fg(GREEN),
        "promoted" => base,
        _ if l.finished => Style { fg: Some(YELLOW), ..base },
        _ => base,
    };
    (
        vec![
            (l.id.clone(), base),
            (l.state.clone(), state_style),
            (l.phase.clone(), base),
            (format!("{}/{}", l.round, l.max_rounds), base),
            (l.creator.clone(), base),
            (reviewers, base),
            (promoted, base),
        ],
        base,
    )
}

/// The cells of rows `off..off + vis` of section `i`.
fn window(
    shown: &Shown,
    waiting: &BTreeMap<String, Waiting>,
    i: usize,
    off: usize,
    vis: usize,
    now: u64,
) -> Vec<Cells> {
    match i {
        0 => shown.sessions.iter().skip(off).take(vis).map(|s| session_cells(s, now)).collect(),
        1 => shown.jobs.iter().skip(off).take(vis).map(|r| job_cells(r, waiting.get(r.job_id()), now)).collect(),
        _ => shown.loops.iter().skip(off).take(vis).map(|l| loop_cells(l)).collect(),
    }
}

fn empty_text(world: &World, i: usize) -> &'static str {
    match i {
        0 if world.sessions.is_empty() => "no sessions (start one with `mam create <agent>`)",
        0 => "no session matches the filter",
        1 if world.jobs.is_empty() => "no jobs in this registry yet",
        1 => "no job matches the filter",
        _ => "no loop matches the filter",
    }
}

/// The first visible row so that `sel` is within `[off, off + vis)`, moving as little as possible.
fn scroll(off: usize, sel: Option<usize>, vis: usize, n: usize) -> usize {
    let mut off = off;
    if let Some(s) = sel {
        if s < off {
            off = s;
        } else if vis > 0 && s >= off + vis {
            off = s + 1 - vis;
        }
    }
    off.min(n.saturating_sub(vis))
}

/// How many body rows each section gets: (sessions, jobs, loops).
fn budget(body: usize, n: [usize; 3], show_loops: bool) -> [usize; 3] {
    let titles = 2 + usize::from(show_loops);
    let avail = body.saturating_sub(titles);
    let need = [n[0].max(1), n[1].max(1), if show_loops { n[2].max(1) } else { 0 }];
    let mut v = [need[0].min((avail / 3).max(2)), 0, need[2].min((avail / 5).max(1))];
    v[1] = avail.saturating_sub(v[0] + v[2]);
    if v[1] > need[1] {
        let mut spare = v[1] - need[1];
        v[1] = need[1];
        for i in [0, 2] {
            let more = spare.min(need[i] - v[i]);
            v[i] += more;
            spare -= more;
        }
    }
    // A screen too small for all: the jobs keep at least one row, taken from the others.
    while v[1] == 0 && need[1] > 0 && (v[0] > 1 || v[2] > 1) {
        let i = if v[0] >= v[2] { 0 } else { 2 };
        v[i] -= 1;
        v[1] += 1;
    }
    if v[0] + v[1] + v[2] > avail {
        // Not even one row each: what fits, in order.
        let mut left = avail;
        for x in v.iter_mut() {
            *x = (*x).min(left);
            left -= *x;
        }
    }
    v
}

fn header(world: &World, app: &App, now: u64, w: usize) -> Line {
    let live = world.jobs.iter().filter(|j| !j.finished()).count();
    let silent = world.jobs.iter().filter(|j| j.silent_ms(now).is_some()).count();
    let mut left = format!(
        "mam ui  {} session{}  {} job{} ({live} live",
        world.sessions.len(),
        if world.sessions.len() == 1 { "" } else { "s" },
        world.jobs.len(),
        if world.jobs.len() == 1 { "" } else { "s" },
    );
    let mut l = Line::default();
    if silent > 0 {
        left.push_str(", ");
        l.push(Style { reverse: true, ..Style::BOLD }, left);
        l.push(Style { bold: true, reverse: true, fg: Some(RED), dim: false }, format!("{silent} silent"));
        left = String::new();
    }
    left.push(')');
    if !world.loops.is_empty() {
        let running = world.loops.iter().filter(|l| !l.finished).count();
        left.push_str(&format!(
            "  {} loop{} ({running} running)",
            world.loops.len(),
            if world.loops.len() == 1 { "" } else { "s" }
        ));
    }
    if !app.filter.is_empty() {
        left.push_str(&format!("  filter: {}", app.filter));
    }
    l.push(Style { reverse: true, ..Style::BOLD }, left);
    let right = "? keys  q quit ";
    let used = width(&l.text());
    if used + width(right) < w {
        l.push(Style { reverse: true, ..Style::PLAIN }, " ".repeat(w - used - width(right)));
        l.push(Style { reverse: true, ..Style::PLAIN }, right);
    } else {
        l.push(Style { reverse: true, ..Style::PLAIN }, " ".repeat(w.saturating_sub(used)));
    }
    l
}

fn footer(world: &World, app: &App, now: u64, w: usize) -> Line {
    match &app.mode {
        Mode::Filter => {
            return Line::styled(
                Style { reverse: true, ..Style::BOLD },
                format!("/{}_  (Enter keeps, Esc clears)", app.filter),
            )
        }
        Mode::Confirm(_, prompt) => {
            return Line::styled(
                Style { bold: true, reverse: true, fg: Some(YELLOW), dim: false },
                format!("{prompt} [y/N]"),
            )
        }
        _ => {}
    }
    if let Some((m, until)) = &app.message {
        if now < *until {
            return Line::styled(Style::BOLD, m.clone());
        }
    }
    let (bus, style) = match &world.bus {
        Bus::Connected(a) => (format!("broker {a} connected"), Style::fg(GREEN)),
        Bus::Connecting(a) => (format!("broker {a} connecting"), Style::fg(YELLOW)),
        Bus::Down(a, why) => (format!("broker {a} not connected ({why})"), Style::fg(RED)),
        Bus::Unconfigured(why) => (format!("broker not configured ({why})"), Style::fg(RED)),
    };
    let mut l = Line::default();
    let reg = world.registry.display().to_string();
    let problems = if world.problems.is_empty() { String::new() } else { format!("  {}", world.problems[0]) };
    // Both fit, or the broker keeps at least half the line and the registry (cut from the left,
    // where paths are alike) the rest.
    let fixed = width("  registry ") + width(&problems);
    let room = w.saturating_sub(fixed);
    let (bw, rw) = (width(&bus), width(&reg));
    let bus_w = if bw + rw <= room { bw } else { bw.min(room.saturating_sub(rw).max(room / 2)) };
    let bus = clip(&bus, bus_w);
    let reg_w = room.saturating_sub(width(&bus));
    l.push(style, bus);
    l.push(Style::DIM, "  registry ");
    l.push(Style::DIM, clip_left(&reg, reg_w));
    if !problems.is_empty() {
        l.push(Style::fg(RED), problems);
    }
    l
}

/// The list screen.
fn list(world: &World, app: &mut App, w: usize, h: usize, now: u64) -> Vec<Line> {
    let shown = shown(world, &app.filter);
    let pos = app.sel.as_ref().and_then(|s| shown.position(s));
    app.settle_in(shown.len(), pos, |i| shown.item(i));
    let sel = app.sel.as_ref().and_then(|s| shown.position(s));
    let n = [shown.sessions.len(), shown.jobs.len(), shown.loops.len()];
    let starts = [0, n[0], n[0] + n[1]];
    let show_loops = !world.loops.is_empty();
    let body = h.saturating_sub(2);
    let v = budget(body, n, show_loops);
    app.page = v[1].max(1);
    let mut out = vec![header(world, app, now, w)];
    let cols: [&[Col]; 3] = [SESSION_COLS, JOB_COLS, LOOP_COLS];
    let names = ["SESSIONS", "JOBS", "LOOPS"];
    for i in 0..3 {
        if i == 2 && !show_loops {
            continue;
        }
        if out.len() >= h.saturating_sub(1) {
            break;
        }
        let local = sel.filter(|&s| s >= starts[i] && s < starts[i] + n[i]).map(|s| s - starts[i]);
        let vis = v[i];
        app.scroll[i] = scroll(app.scroll[i], local, vis, n[i]);
        let off = app.scroll[i];
        let rows = window(&shown, &world.waiting, i, off, vis, now);
        let texts: Vec<Vec<String>> = rows.iter().map(|(c, _)| c.iter().map(|(s, _)| s.clone()).collect()).collect();
        let ws = widths(cols[i], &texts, w);
        let range = (n[i] > vis).then(|| (off + 1, (off + vis).min(n[i]), n[i]));
        out.push(title_line(names[i], cols[i], &ws, w, range));
        if n[i] == 0 && vis > 0 {
            out.push(Line::styled(Style::DIM, format!("  {}", empty_text(world, i))));
            continue;
        }
        for (k, (cells, base)) in rows.iter().enumerate() {
            out.push(row_line(cells, &ws, local == Some(off + k), *base));
        }
    }
    while out.len() < h.saturating_sub(1) {
        out.push(Line::default());
    }
    out.truncate(h.saturating_sub(1));
    if h > 0 {
        out.push(footer(world, app, now, w));
    }
    out
}

fn help(w: usize, h: usize) -> Vec<Line> {
    let mut out = vec![Line::styled(Style { reverse: true, ..Style::BOLD }, "mam ui: keys (any key goes back)")];
    let kw = KEYS.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
    for (k, d) in KEYS {
        let mut l = Line::default();
        l.push(Style::BOLD, format!("  {}", fit(k, kw)));
        l.push(Style::PLAIN, format!("  {d}"));
        out.push(l);
    }
    out.push(Line::default());
    for t in [
        "JOBS: live first, then finished (dim). EVIDENCE/IDLE: the age of the last",
        "sign of life against the idle window; a silent job is red, with how long.",
        "mam ui reads files and the bus; it changes nothing except through the",
        "commands it runs when you confirm (mam stop, mam registry status).",
    ] {
        out.push(Line::styled(Style::DIM, format!("  {t}")));
    }
    out.truncate(h);
    while out.len() < h {
        out.push(Line::default());
    }
    let _ = w;
    out
}

fn view(app: &mut App, w: usize, h: usize) -> Vec<Line> {
    let page = h.saturating_sub(2).max(1);
    app.page = page;
    let Mode::View(p) = &mut app.mode else { return Vec::new() };
    let title = p.title.clone();
    let follow = p.follow.is_some();
    let at_end = p.at_end;
    let n = p.wrapped(w).len();
    let max_top = n.saturating_sub(page);
    if follow && at_end {
        p.top = max_top;
    }
    p.top = p.top.min(max_top);
    let top = p.top;
    let lines: Vec<String> = p.wrapped(w).iter().skip(top).take(page).cloned().collect();
    let mut out = vec![Line::styled(Style { reverse: true, ..Style::BOLD }, title)];
    for l in lines {
        out.push(Line::plain(l));
    }
    while out.len() < h.saturating_sub(1) {
        out.push(Line::styled(Style::DIM, "~"));
    }
    out.truncate(h.saturating_sub(1));
    let pos = if n == 0 { "empty".to_string() } else { format!("lines {}-{} of {n}", top + 1, (top + page).min(n)) };
    let tail = if follow {
        if at_end {
            "  following"
        } else {
            "  (G: follow)"
        }
    } else {
        ""
    };
    out.push(Line::styled(Style::DIM, format!("{pos}{tail}  j/k scroll  PgUp/PgDn  g/G top/end  q back")));
    out
}

/// The screen: exactly `h` lines, each `w` cells once rendered.
pub fn draw(world: &World, app: &mut App, w: usize, h: usize, now: u64) -> Vec<Line> {
    match &app.mode {
        Mode::Help => help(w, h),
        Mode::View(_) => view(app, w, h),
        _ => list(world, app, w, h, now),
    }
}

/// The screen as plain text (`mam ui --snapshot`): one line per row, trailing spaces kept off.
pub fn plain(lines: &[Line], w: usize) -> String {
    let mut s = String::new();
    for l in lines {
        s.push_str(crate::ui::cells::strip(&l.render(w)).trim_end());
        s.push('\n');
    }
    s
}

/// `HH:MM:SS` of a ms timestamp (UTC), for text views.
pub fn hms(ms: u64) -> String {
    clock::format_ts(ms)[11..19].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::cells::strip;
    use std::path::PathBuf;

    fn job(id: &str, status: &str, ev: Option<u64>, idle: u64) -> Row {
        let reason = (status == "deadline_timeout").then_some("unresponsive");
        let mut r = Row::new(id, status, "worker-ok", id).with_details("task", reason, None);
        r.attempt = Some(1);
        r.evidence_ms = ev.into();
        r.heartbeat_ms = ev.into();
        r.started_ms = Some(0).into();
        r.finished_ms = crate::registry::is_terminal(status).then_some(3_000).into();
        r.idle_ms = idle;
        r
    }

    fn world(n_jobs: usize) -> World {
        let mut jobs =
            vec![job("aaaa0001", "running", Some(10_000), 30_000), job("aaaa0002", "running", Some(0), 3_000)];
        jobs.push(job("aaaa0003", "deadline_timeout", Some(0), 3_000));
        for i in 0..n_jobs {
            jobs.push(job(&format!("b{i:07}"), "completed", Some(0), 3_000));
        }
        World {
            registry: PathBuf::from("/home/me/src/myproject/.mam/jobs"),
            sessions_file: PathBuf::from("/x"),
            jobs,
            sessions: vec![SessionView {
                name: "worker-ok".into(),
                agent: "claude".into(),
                backend: "tmux".into(),
                server: "mam".into(),
                pane: "%1".into(),
                state: "working".into(),
                job: Some(("aaaa0001".into(), "running".into(), Some(0))),
                last_job: Some("aaaa0001".into()),
            }],
            loops: vec![LoopView {
                id: "0badcafe".into(),
                state: "running".into(),
                finished: false,
                phase: "review".into(),
                round: 2,
                max_rounds: 3,
                creator: "creator".into(),
                reviewers: vec![("rev-a".into(), "PASS".into()), ("rev-b".into(), "pending".into())],
                promoted: vec![],
                job: None,
                loop_job: "cccc0001".into(),
            }],
            bus: Bus::Connected("127.0.0.1:1883".into()),
            problems: vec![],
            waiting: BTreeMap::new(),
        }
    }

    fn text(lines: &[Line], w: usize) -> Vec<String> {
        lines.iter().map(|l| strip(&l.render(w))).collect()
    }

    /// Issue 32 item 6: the filter `rev` keeps the loop whose reviewers are rev-a and rev-b.
    #[test]
    fn the_filter_matches_a_loop_s_reviewers() {
        let w = world(0);
        assert_eq!(crate::ui::app::shown(&w, "rev").loops.len(), 1);
        assert_eq!(crate::ui::app::shown(&w, "pending").loops.len(), 1);
        assert_eq!(crate::ui::app::shown(&w, "nobody").loops.len(), 0);
    }

    /// Issue 32 item 6: on herdr the PANE column keeps the pane id whatever the server's name.
    #[test]
    fn the_pane_column_keeps_the_pane_id() {
        let mut w = world(0);
        w.sessions[0].backend = "herdr".into();
        w.sessions[0].server = "multi-agent-mux".into();
        w.sessions[0].pane = "w1:p3".into();
        let t = text(&draw(&w, &mut App::default(), 80, 24, 12_000), 80);
        assert!(t[2].starts_with("> worker-ok") && t[2].contains("w1:p3"), "{}", t[2]);
    }

    #[test]
    fn eighty_by_twenty_four() {
        let mut app = App::default();
        let lines = draw(&world(3), &mut app, 80, 24, 12_000);
        assert_eq!(lines.len(), 24);
        let t = text(&lines, 80);
        assert!(t.iter().all(|l| l.chars().count() == 80), "{t:#?}");
        assert!(t[0].starts_with("mam ui  1 session  6 jobs (2 live, 1 silent)  1 loop (1 running)"), "{}", t[0]);
        assert!(t[1].contains("SESSIONS") && t[1].contains("STATE"), "{}", t[1]);
        assert!(t[2].starts_with("> worker-ok"), "the first row is selected: {}", t[2]);
        let jobs = t.iter().position(|l| l.trim_start().starts_with("JOBS")).unwrap();
        assert!(t[jobs + 1].contains("aaaa0001") && t[jobs + 1].contains("alive"), "{}", t[jobs + 1]);
        assert!(t[jobs + 1].contains("2s/30s #....."), "{}", t[jobs + 1]);
        assert!(t[jobs + 2].contains("SILENT 12s") && t[jobs + 2].contains("!!!!!!"), "{}", t[jobs + 2]);
        assert!(t[jobs + 3].contains("deadline_timeout") && t[jobs + 3].contains("unresponsive"), "{}", t[jobs + 3]);
        assert!(t.iter().any(|l| l.contains("0badcafe") && l.contains("rev-a PASS, rev-b pending")), "{t:#?}");
        assert!(t[23].starts_with("broker 127.0.0.1:1883 connected  registry /home/me/"), "{}", t[23]);
        // Finished rows are dim, the silent one bold red.
        let silent = lines[jobs + 2].render(80);
        assert!(silent.contains("\x1b[0;1;31m"), "{silent:?}");
        assert!(lines[jobs + 4].render(80).contains("\x1b[0;2m"));
    }

    #[test]
    fn narrow_screens_drop_columns_and_many_jobs_scroll() {
        let mut app = App::default();
        let t = text(&draw(&world(200), &mut app, 50, 20, 12_000), 50);
        assert!(t.iter().all(|l| l.chars().count() == 50));
        let jobs_title = t.iter().find(|l| l.trim_start().starts_with("JOBS")).unwrap();
        assert!(!jobs_title.contains(" HB") && !jobs_title.contains("ELAPSED"), "dropped at 50 columns: {jobs_title}");
        assert!(jobs_title.contains("of 203"), "{jobs_title}");
        let t = text(&draw(&world(200), &mut app, 60, 20, 12_000), 60);
        assert!(t.iter().all(|l| l.chars().count() == 60));
        let items = crate::ui::app::items(&world(200), "");
        for _ in 0..40 {
            app.key(crate::ui::keys::Key::Char('j'), &items);
        }
        let t = text(&draw(&world(200), &mut app, 60, 20, 12_000), 60);
        let sel = t.iter().find(|l| l.starts_with("> ")).unwrap();
        assert!(sel.starts_with("> b0000036"), "{t:#?}");
        assert!(!t.iter().any(|l| l.contains("aaaa0001") && l.contains("alive")), "scrolled past the first jobs");
        // Tiny screens still give exactly h lines of w cells.
        for (w, h) in [(20, 5), (10, 3), (80, 2), (5, 1)] {
            let l = draw(&world(5), &mut App::default(), w, h, 0);
            assert_eq!(l.len(), h);
            assert!(text(&l, w).iter().all(|x| x.chars().count() == w));
        }
    }

    #[test]
    fn budget_shares_the_body() {
        assert_eq!(budget(22, [1, 200, 1], true), [1, 17, 1]);
        assert_eq!(budget(22, [10, 200, 0], false), [6, 14, 0]);
        assert_eq!(budget(22, [10, 2, 0], false), [10, 2, 0]);
        assert_eq!(budget(3, [5, 5, 5], true), [0, 0, 0]);
        assert_eq!(budget(5, [5, 5, 5], true), [1, 1, 0]);
    }
}
