//! Placement (ORCH 1.5): where a new agent goes (reuse an idle pane, split, or a new workspace), the
//! start-up dialog rule, and `place_and_start` with its rollback, written once over the `Backend`
//! trait. The decisions (`choose`, `split_plan`, `dialog_step`) are pure and unit-tested.
//!
//! It never prints; results are values.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::contract::{valid_name, Backend, Dir, PaneError, PaneInfo, PaneResult, Status, Workspace};
use super::knobs::Knobs;
use crate::agents::{self, Adapter, Dialog};
use crate::sys;

/// Where a new agent goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Reuse the idle pane of workspace `ws` (index into the list).
    Reuse { ws: usize, pane: String },
    /// Split `from` in direction `dir` inside workspace `ws`.
    Split { ws: usize, from: String, dir: Dir },
    /// Every same-cwd workspace is full.
    Create,
}

/// 1.5 steps 2-3: the first workspace with an idle pane (only when the environment set is empty) or
/// room in its 2 x `rows` grid. An idle pane counts toward the pane count.
pub fn choose(workspaces: &[Workspace], env_empty: bool, rows: u32) -> Choice {
    let capacity = 2 * rows.max(1) as usize;
    for (i, ws) in workspaces.iter().enumerate() {
        if env_empty {
            if let Some(p) = ws.panes.iter().find(|p| p.idle()) {
                return Choice::Reuse { ws: i, pane: p.id.clone() };
            }
        }
        if !ws.panes.is_empty() && ws.panes.len() < capacity {
            let (from, dir) = split_plan(&ws.panes);
            return Choice::Split { ws: i, from, dir };
        }
    }
    Choice::Create
}

/// 1.5 step 4: the second pane splits the root to the right; later panes split the bottom pane of
/// the column holding fewer panes downward, ties to the left column.
pub fn split_plan(panes: &[PaneInfo]) -> (String, Dir) {
    let [left, right] = columns(panes);
    if right.is_empty() {
        return (left.first().map(|p| p.id.clone()).unwrap_or_default(), Dir::Right);
    }
    let col = if right.len() < left.len() { &right } else { &left };
    (col.last().map(|p| p.id.clone()).unwrap_or_default(), Dir::Down)
}

/// The two grid columns, each top to bottom. With geometry: the leftmost x is the left column.
/// Without: the panes are taken in creation order and placed by the rule itself.
fn columns(panes: &[PaneInfo]) -> [Vec<&PaneInfo>; 2] {
    let mut cols: [Vec<&PaneInfo>; 2] = [Vec::new(), Vec::new()];
    if !panes.is_empty() && panes.iter().all(|p| p.pos.is_some()) {
        let min_x = panes.iter().filter_map(|p| p.pos).map(|(x, _)| x).min().unwrap_or(0);
        for p in panes {
            let (x, _) = p.pos.unwrap_or((0, 0));
            cols[usize::from(x != min_x)].push(p);
        }
        for c in &mut cols {
            crate::sort::by_key(c, |p| p.pos.map(|(_, y)| y).unwrap_or(0));
        }
        return cols;
    }
    for (i, p) in panes.iter().enumerate() {
        let c = match i {
            0 => 0,
            1 => 1,
            _ => usize::from(cols[1].len() < cols[0].len()),
        };
        cols[c].push(p);
    }
    cols
}

/// One step of the start-up dialog rule (1.5 step 7): given the status after start and the number of
/// `enter`s already sent, what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialogStep {
    Ready,
    SendEnter,
    Fail,
}

pub fn dialog_step(status: Status, enters_sent: u32, max: u32) -> DialogStep {
    match status {
        Status::Blocked if enters_sent < max => DialogStep::SendEnter,
        Status::Blocked => DialogStep::Fail,
        _ => DialogStep::Ready,
    }
}

/// What `place_and_start` needs.
#[derive(Debug, Clone)]
pub struct PlaceRequest {
    pub name: String,
    pub kind: String,
    pub cwd: PathBuf,
    /// The environment set E (1.5 step 1); reaches the agent only on create/split.
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// `MAM_WS_LABEL`.
    pub label: Option<String>,
}

/// Where the agent landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub pane: String,
    pub workspace: String,
    pub server: String,
    pub reused: bool,
    /// This attempt created the workspace (a rollback may close it).
    pub created_workspace: bool,
}

/// A placement that failed after it touched a pane: what to roll back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceFailure {
    pub error: PaneError,
    pub partial: Option<Placed>,
}

/// 1.5 in full: ensure the server, choose a pane, create/split/reuse, rename the chosen workspace,
/// start the agent and clear start-up dialogs. On failure after a pane was chosen, `partial` says
/// which pane (and whether its workspace is new) so the caller can roll back.
pub fn place_and_start(b: &dyn Backend, req: &PlaceRequest, knobs: &Knobs) -> Result<Placed, PlaceFailure> {
    let early = |e: PaneError| PlaceFailure { error: e, partial: None };
    if !valid_name(&req.name) {
        return Err(early(PaneError::Usage(format!(
            "invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})",
            crate::text::one_line(&req.name)
        ))));
    }
    b.ensure_server().map_err(early)?;
    let workspaces = b.list_workspaces(&req.cwd).map_err(early)?;
    let choice = choose(&workspaces, req.env.is_empty(), knobs.ws_rows);
    let placed = match choice {
        Choice::Reuse { ws, pane } => Placed {
            pane,
            workspace: workspaces[ws].id.clone(),
            server: b.server(),
            reused: true,
            created_workspace: false,
        },
        Choice::Split { ws, from, dir } => {
            let pane = b.split(&from, dir, &req.cwd, &req.env).map_err(early)?;
            Placed {
                pane,
                workspace: workspaces[ws].id.clone(),
                server: b.server(),
                reused: false,
                created_workspace: false,
            }
        }
        Choice::Create => {
            let c = b.create_workspace(&req.cwd, req.label.as_deref(), &req.env).map_err(early)?;
            Placed { pane: c.pane, workspace: c.workspace, server: b.server(), reused: false, created_workspace: true }
        }
    };
    let fail = |e: PaneError| PlaceFailure { error: e, partial: Some(placed.clone()) };
    if let (Some(label), false) = (&req.label, placed.created_workspace) {
        b.rename_workspace(&placed.workspace, label).map_err(fail)?;
    }
    b.start_agent(&req.name, &req.kind, &placed.pane, &req.args).map_err(fail)?;
    match agents::adapter_of_started(&req.kind).filter(|a| a.has_ready_line() && b.shows_screen()) {
        // An agent that exited is named with what it left in its pane (the last screen read before
        // it went may predate its error: herdr reads an agent only while it runs).
        Some(ad) => {
            pass_startup_screens(b, &req.name, ad, knobs).map_err(|e| match (e, b.read_pane(&placed.pane)) {
                (PaneError::Exited(_), Some(text)) => fail(PaneError::Exited(format!(
                    "agent {} ({}) exited during start; last screen lines: {}",
                    req.name,
                    ad.kind,
                    crate::text::screen_tail(&text, 5)
                ))),
                (e, _) => fail(e),
            })?
        }
        None => clear_startup_dialogs(b, &req.name, knobs).map_err(fail)?,
    }
    Ok(placed)
}

/// What a start-up answer answered: a dialog of the adapter's table seen on the screen, or a
/// `blocked` status with no dialog the table knows (1.5 step 7: `enter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompted {
    Dialog(&'static Dialog),
    Blocked,
}

impl Prompted {
    fn keys(self) -> &'static [&'static str] {
        match self {
            Prompted::Dialog(d) => d.keys,
            Prompted::Blocked => &["enter"],
        }
    }
}

/// One look at the screen during start-up (A58).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScreenStep {
    Ready,
    Answer(Prompted),
    /// Still prompted after the answers allowed.
    Stuck(Prompted),
    Wait,
}

/// The pure decision of `pass_startup_screens`. The CLI's own input line with no dialog and no
/// `blocked` status means ready; a dialog of the adapter's table is answered with its keys, a
/// `blocked` status the table cannot explain with `enter`. The same prompt answered a moment ago is
/// answered again only once `settled` (the settle time passed), so a key is not typed twice into a
/// screen that is still redrawing. `last` is the last answer, `answers` how many were given.
pub fn screen_step(
    ad: &Adapter,
    screen: &str,
    blocked: bool,
    last: Option<(Prompted, bool)>,
    answers: u32,
    max: u32,
) -> ScreenStep {
    let prompted = match ad.dialog_on(screen) {
        // The CLI is acting on the answer (gemini restarting after its trust dialog): wait for it.
        Some(d) if ad.busy_after(screen, d) => return ScreenStep::Wait,
        Some(d) => Prompted::Dialog(d),
        None if blocked => Prompted::Blocked,
        None if ad.ready_on(screen) => return ScreenStep::Ready,
        None => return ScreenStep::Wait,
    };
    // A kind's own dialogs may be answered three times each (codex shows four in a row, and on a loaded
    // machine a key sent while a dialog is still drawing can be lost: seen with codex's
    // 'Detected OPENAI_API_KEY'); a status the table cannot explain, at most MAM_STARTUP_DIALOG_MAX
    // times.
    let limit = match prompted {
        Prompted::Dialog(_) => max.max(DIALOG_TRIES * ad.dialogs.len() as u32),
        Prompted::Blocked => max,
    };
    match last {
        Some((prev, false)) if prev == prompted => ScreenStep::Wait,
        _ if answers >= limit => ScreenStep::Stuck(prompted),
        _ => ScreenStep::Answer(prompted),
    }
}

/// A58 in place of 1.5 step 7 for kinds whose input line is known: read the agent's screen until it
/// shows the input line, answering each start-up dialog of the adapter's table with its keys (and a
/// `blocked` status the table cannot explain with `enter`), within `MAM_AGENT_START_TIMEOUT_MS`.
/// "Ready" is never just a live process: claude's trust dialog and codex's login chooser run in a
/// live process that herdr may even call idle.
pub fn pass_startup_screens(b: &dyn Backend, name: &str, ad: &'static Adapter, knobs: &Knobs) -> PaneResult<()> {
    let deadline = Instant::now() + Duration::from_millis(knobs.start_timeout_ms as u64);
    let settle = Duration::from_millis(knobs.dialog_settle_ms.max(200));
    let mut answers = 0u32;
    let mut last: Option<(Prompted, Instant)> = None;
    let mut screen = String::new();
    let hold = Duration::from_millis(ad.ready_hold_ms);
    let mut ready_since: Option<Instant> = None;
    // When the agent's process was last seen gone (tmux still reads a pane that is back at its shell).
    let mut gone_since: Option<Instant> = None;
    let mut checked = Instant::now();
    let exited = |screen: &str| {
        PaneError::Exited(format!(
            "agent {name} ({}) exited during start; last screen lines: {}",
            ad.kind,
            crate::text::screen_tail(screen, 5)
        ))
    };
    loop {
        match b.read_detection(name) {
            Ok(s) => screen = s,
            Err(_) if b.agent_status(name) == Status::Absent => return Err(exited(&screen)),
            Err(_) => {}
        }
        // A CLI that refuses its arguments (claude `--resume` of a conversation it never wrote, gemini's
        // of one with no reply) exits within seconds: seen gone twice, 400 ms apart, it failed now
        // rather than at the start timeout.
        if checked.elapsed() >= EXIT_CHECK && !ad.ready_on(&screen) {
            checked = Instant::now();
            if b.agent_status(name) == Status::Absent {
                match gone_since {
                    Some(at) if at.elapsed() >= EXIT_CHECK => return Err(exited(&screen)),
                    Some(_) => {}
                    None => gone_since = Some(Instant::now()),
                }
            } else {
                gone_since = None;
            }
        }
        let blocked = b.has_lifecycle() && b.agent_status(name) == Status::Blocked;
        let seen = last.map(|(p, at)| (p, at.elapsed() >= settle));
        let step = screen_step(ad, &screen, blocked, seen, answers, knobs.dialog_max);
        if step != ScreenStep::Ready {
            ready_since = None;
        }
        match step {
            // Ready once the input line held for the kind's hold time.
            ScreenStep::Ready if ready_since.get_or_insert_with(Instant::now).elapsed() >= hold => return Ok(()),
            ScreenStep::Ready => {}
            ScreenStep::Stuck(Prompted::Dialog(d)) => {
                return Err(PaneError::Failed(format!(
                    "agent {name} still blocked in its start-up dialog '{}' after {answers} answer(s) \
                     (MAM_STARTUP_DIALOG_MAX={}); last screen lines: {}",
                    d.screen,
                    knobs.dialog_max,
                    crate::text::screen_tail(&screen, 5)
                )))
            }
            ScreenStep::Stuck(Prompted::Blocked) => {
                return Err(PaneError::Failed(format!(
                    "agent {name} still blocked after {answers} start-up dialog enter(s) (MAM_STARTUP_DIALOG_MAX={})",
                    knobs.dialog_max
                )))
            }
            ScreenStep::Answer(p) => {
                for k in p.keys() {
                    b.send_keys(name, k)?;
                }
                answers += 1;
                last = Some((p, Instant::now()));
            }
            ScreenStep::Wait => {}
        }
        if Instant::now() >= deadline {
            return Err(PaneError::Failed(format!(
                "agent {name} ({}) not ready within {} ms: its input line {} never showed \
                 (MAM_AGENT_START_TIMEOUT_MS); last screen lines: {}",
                ad.kind,
                knobs.start_timeout_ms,
                ad.ready_text(),
                crate::text::screen_tail(&screen, 5)
            )));
        }
        sys::sleep(Duration::from_millis(100));
    }
}

/// How many answers each of a kind's start-up dialogs may take (on average over its dialogs).
const DIALOG_TRIES: u32 = 3;

/// How often start-up looks for an agent that exited, and how long it must stay gone.
const EXIT_CHECK: Duration = Duration::from_millis(400);

/// Undoes what a placement created: the workspace when this attempt created it, else the split pane;
/// a reused pane is left as it was found. Sessions' verified rollback (ORCH 2.3) starts here.
pub fn rollback(b: &dyn Backend, p: &Placed) -> PaneResult<()> {
    if p.created_workspace {
        b.close_workspace(&p.workspace)
    } else if !p.reused {
        b.close_pane(&p.pane)
    } else {
        Ok(())
    }
}

/// 1.5 step 7: a `blocked` agent after start gets `enter`, at most `dialog_max` times; still blocked
/// is a start failure. Agent-agnostic: no screen matching.
pub fn clear_startup_dialogs(b: &dyn Backend, name: &str, knobs: &Knobs) -> PaneResult<()> {
    let mut sent = 0;
    let mut status = b.agent_status(name);
    // A backend that classifies the screen (herdr) may report the agent idle when `agent start`
    // returns and see its dialog a moment later: give a dialog the settle time to show.
    if b.has_lifecycle() && status != Status::Blocked {
        let deadline = Instant::now() + Duration::from_millis(knobs.dialog_settle_ms);
        while status != Status::Blocked && Instant::now() < deadline {
            sys::sleep(Duration::from_millis(knobs.poll_ms.clamp(10, 200)));
            status = b.agent_status(name);
        }
    }
    loop {
        match dialog_step(status, sent, knobs.dialog_max) {
            DialogStep::Ready => return Ok(()),
            DialogStep::Fail => {
                return Err(PaneError::Failed(format!(
                    "agent {name} still blocked after {sent} start-up dialog enter(s) (MAM_STARTUP_DIALOG_MAX={})",
                    knobs.dialog_max
                )))
            }
            DialogStep::SendEnter => {
                b.send_keys(name, "enter")?;
                sent += 1;
                let deadline = Instant::now() + Duration::from_millis(knobs.dialog_settle_ms);
                loop {
                    status = b.agent_status(name);
                    if status != Status::Blocked || Instant::now() >= deadline {
                        break;
                    }
                    sys::sleep(Duration::from_millis(knobs.poll_ms.clamp(10, 200)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pane(id: &str, agent: bool) -> PaneInfo {
        PaneInfo { id: id.into(), has_agent: agent, shell_foreground: !agent, pos: None }
    }

    fn ws(id: &str, panes: Vec<PaneInfo>) -> Workspace {
        Workspace { id: id.into(), label: String::new(), panes }
    }

    #[test]
    fn split_layout_second_right_then_fewer_column_down() {
        let mut panes = vec![pane("p0", true)];
        assert_eq!(split_plan(&panes), ("p0".into(), Dir::Right));
        panes.push(pane("p1", true));
        // Tie: left column, its bottom pane, downward.
        assert_eq!(split_plan(&panes), ("p0".into(), Dir::Down));
        panes.push(pane("p2", true));
        assert_eq!(split_plan(&panes), ("p1".into(), Dir::Down));
        panes.push(pane("p3", true));
        assert_eq!(split_plan(&panes), ("p2".into(), Dir::Down));
    }

    #[test]
    fn split_layout_uses_geometry_when_reported() {
        let g =
            |id: &str, x, y| PaneInfo { id: id.into(), has_agent: true, shell_foreground: false, pos: Some((x, y)) };
        // Pane order differs from creation order; geometry decides.
        let panes = vec![g("a", 0, 0), g("b", 0, 1), g("c", 1, 0)];
        assert_eq!(split_plan(&panes), ("c".into(), Dir::Down));
        let panes = vec![g("a", 0, 0), g("c", 1, 0), g("d", 1, 1)];
        assert_eq!(split_plan(&panes), ("a".into(), Dir::Down));
    }

    #[test]
    fn o1_9_4_packing_four_then_two() {
        // Simulate six placements with K = 2: 4 + 2.
        let mut wss: Vec<Workspace> = Vec::new();
        for n in 0..6 {
            match choose(&wss, true, 2) {
                Choice::Create => wss.push(ws(&format!("w{n}"), vec![pane(&format!("p{n}"), true)])),
                Choice::Split { ws, .. } => wss[ws].panes.push(pane(&format!("p{n}"), true)),
                Choice::Reuse { .. } => panic!("no idle pane exists"),
            }
        }
        let sizes: Vec<usize> = wss.iter().map(|w| w.panes.len()).collect();
        assert_eq!(sizes, [4, 2]);
    }

    #[test]
    fn o1_9_5_idle_pane_in_second_workspace_is_reused() {
        let full = ws("w1", (0..4).map(|i| pane(&format!("a{i}"), true)).collect());
        let second = ws("w2", vec![pane("b0", true), pane("b1", false)]);
        assert_eq!(choose(&[full.clone(), second.clone()], true, 2), Choice::Reuse { ws: 1, pane: "b1".into() });
        // With an environment set the idle pane is not used: the workspace still has room, so split.
        assert!(matches!(choose(&[full, second], false, 2), Choice::Split { ws: 1, .. }));
    }

    #[test]
    fn idle_pane_counts_toward_room() {
        let mut panes: Vec<PaneInfo> = (0..3).map(|i| pane(&format!("a{i}"), true)).collect();
        panes.push(pane("idle", false));
        assert_eq!(choose(&[ws("w1", panes)], false, 2), Choice::Create);
    }

    #[test]
    fn screens_pass_dialogs_once_each_then_ready() {
        let c = agents::adapter("claude").unwrap();
        let trust = "Accessing workspace:\n ❯ 1. Yes, I trust this folder\n   2. No, exit";
        let ScreenStep::Answer(d) = screen_step(c, trust, true, None, 0, 3) else { panic!() };
        assert_eq!(d.keys(), ["enter"]);
        // The same dialog again before it had time to react: no second key.
        assert_eq!(screen_step(c, trust, false, Some((d, false)), 1, 3), ScreenStep::Wait);
        assert_eq!(screen_step(c, trust, false, Some((d, true)), 1, 3), ScreenStep::Answer(d));
        // gemini restarting after its trust dialog: the dialog, still on screen, is not answered again.
        let g = agents::adapter("gemini").unwrap();
        let restarting = "│ ● 1. Trust folder (ws) │\n Do you trust the files in this folder?\n Gemini CLI is restarting to apply the trust changes...\n";
        assert_eq!(screen_step(g, restarting, false, None, 1, 3), ScreenStep::Wait);
        let g_trust = " Do you trust the files in this folder?\n ● 1. Trust folder (ws)\n";
        assert!(matches!(screen_step(g, g_trust, false, None, 0, 3), ScreenStep::Answer(_)));
        // Each of the kind's dialogs may be answered three times (a key lost on a loaded machine).
        let limit = 3u32.max(DIALOG_TRIES * c.dialogs.len() as u32);
        assert_eq!(screen_step(c, trust, false, Some((d, true)), limit - 1, 3), ScreenStep::Answer(d));
        assert_eq!(screen_step(c, trust, false, Some((d, true)), limit, 3), ScreenStep::Stuck(d));
        // The next dialog is answered at once, with its own key (the default is No).
        let key = "Detected a custom API key in your environment\n 1. Yes\n ❯ 2. No (recommended)";
        let ScreenStep::Answer(k) = screen_step(c, key, false, Some((d, false)), 1, 3) else { panic!() };
        assert_eq!(k.keys(), ["1"]);
        let ready = "──\n❯ \n──\n  ? for shortcuts";
        assert_eq!(screen_step(c, ready, false, Some((k, false)), 2, 3), ScreenStep::Ready);
        // A backend that still says blocked at the input line gets enter, bounded by the knob alone.
        assert_eq!(screen_step(c, ready, true, None, 0, 1), ScreenStep::Answer(Prompted::Blocked));
        assert_eq!(screen_step(c, ready, true, None, 1, 1), ScreenStep::Stuck(Prompted::Blocked));
        assert_eq!(screen_step(c, "", false, None, 0, 3), ScreenStep::Wait);
        // codex: four dialogs in a row pass with the default of three.
        let x = agents::adapter("codex").unwrap();
        let login = "Welcome to Codex\n> 1. Sign in with ChatGPT\n  3. Sign in another way";
        let ScreenStep::Answer(l) = screen_step(x, login, false, None, 3, 3) else { panic!() };
        assert_eq!(l.keys(), ["3"]);
        let trust = "Folder access\n› 1. Trust and continue\n  2. Back";
        assert!(matches!(screen_step(x, trust, false, Some((l, false)), 3, 3), ScreenStep::Answer(_)));
        let ready = "› Ask Codex to do anything\n ← for agents · ? for shortcuts";
        assert_eq!(screen_step(x, ready, false, None, 4, 3), ScreenStep::Ready);
    }

    #[test]
    fn o1_9_10_dialog_rule_bounded() {
        assert_eq!(dialog_step(Status::Idle, 0, 3), DialogStep::Ready);
        assert_eq!(dialog_step(Status::Blocked, 0, 3), DialogStep::SendEnter);
        assert_eq!(dialog_step(Status::Blocked, 2, 3), DialogStep::SendEnter);
        assert_eq!(dialog_step(Status::Blocked, 3, 3), DialogStep::Fail);
        assert_eq!(dialog_step(Status::Blocked, 0, 0), DialogStep::Fail);
    }
}
