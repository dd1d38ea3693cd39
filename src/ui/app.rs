//! The state of `mam ui`'s screen and what each key does to it (issue 22): the selected row (by
//! identity, so it stays on the same session, job or loop while rows come and go), the filter, the
//! mode (the list, the key help, typing a filter, a stop confirmation, a text view), and the
//! message line. A pure state machine: `App::key` returns an `Action` for the caller to carry out
//! (jump to a pane, open a report or events.log, stop after the confirmation, quit).

use crate::ui::keys::Key;
use crate::view::jobs::Row;
use crate::view::world::{LoopView, SessionView, World};

/// A selectable row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Session(String),
    Job(String),
    Loop(String),
}

/// What a confirmed `s` stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopWhat {
    /// `mam stop <session>`.
    Session(String),
    /// `mam registry status <job> --set cancelled`.
    Job(String),
}

/// A text view (a report, or events.log followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pager {
    pub title: String,
    pub lines: Vec<String>,
    /// The first wrapped line shown.
    pub top: usize,
    /// events.log views follow the file: the job whose log it is, and whether the view sticks to
    /// the end (it does until the person scrolls up).
    pub follow: Option<String>,
    pub at_end: bool,
    wrapped: Option<(usize, Vec<String>)>,
}

impl Pager {
    pub fn new(title: String, lines: Vec<String>, follow: Option<String>) -> Pager {
        let at_end = follow.is_some();
        Pager { title, lines, top: 0, follow, at_end, wrapped: None }
    }

    /// New text for a followed view (kept at the end when it was there).
    pub fn replace(&mut self, lines: Vec<String>) {
        if lines != self.lines {
            self.lines = lines;
            self.wrapped = None;
        }
    }

    /// The lines cut into pieces of at most `w` cells (cached per width).
    pub fn wrapped(&mut self, w: usize) -> &[String] {
        let w = w.max(1);
        if self.wrapped.as_ref().map(|(ww, _)| *ww) != Some(w) {
            let mut out = Vec::new();
            for l in &self.lines {
                wrap_into(l, w, &mut out);
            }
            self.wrapped = Some((w, out));
        }
        &self.wrapped.as_ref().expect("just set").1
    }
}

fn wrap_into(line: &str, w: usize, out: &mut Vec<String>) {
    use crate::ui::cells::char_width;
    let mut cur = String::new();
    let mut used = 0;
    for c in line.chars() {
        let cw = char_width(c);
        if used + cw > w {
            out.push(std::mem::take(&mut cur));
            used = 0;
        }
        cur.push(c);
        used += cw;
    }
    out.push(cur);
}

/// What the screen is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    List,
    Help,
    /// Typing a filter (applied as it is typed).
    Filter,
    /// Waiting for y to stop.
    Confirm(StopWhat, String),
    View(Pager),
}

/// What the caller does after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Enter: go to the pane of the row's session.
    Jump(Item),
    /// r: the report of the row's job.
    Report(Item),
    /// l: the row's job's events.log.
    Events(Item),
    /// s: ask to stop the row (the caller checks it can be and calls `confirm`).
    AskStop(Item),
    /// y after `AskStop`: stop it.
    Stop(StopWhat),
}

/// The screen's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    pub mode: Mode,
    pub filter: String,
    pub sel: Option<Item>,
    /// Where the selection was in the list (kept when its row goes away).
    pub sel_index: usize,
    /// First visible row of each section (sessions, jobs, loops), kept by the drawing.
    pub scroll: [usize; 3],
    /// Body rows of the list (a page for PgUp/PgDn), set by the drawing.
    pub page: usize,
    /// A line for the person, shown in the footer until the given time (ms).
    pub message: Option<(String, u64)>,
}

impl Default for App {
    fn default() -> App {
        App {
            mode: Mode::List,
            filter: String::new(),
            sel: None,
            sel_index: 0,
            scroll: [0; 3],
            page: 10,
            message: None,
        }
    }
}

/// Case-insensitive: does any of `fields` contain `filter`?
fn matches(filter: &str, fields: &[&str]) -> bool {
    if filter.is_empty() {
        return true;
    }
    let f = filter.to_lowercase();
    fields.iter().any(|s| s.to_lowercase().contains(&f))
}

/// The rows the filter keeps, by section, in screen order (sessions, jobs, loops).
#[derive(Debug)]
pub struct Shown<'a> {
    pub sessions: Vec<&'a SessionView>,
    pub jobs: Vec<&'a Row>,
    pub loops: Vec<&'a LoopView>,
}

impl Shown<'_> {
    pub fn len(&self) -> usize {
        self.sessions.len() + self.jobs.len() + self.loops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The row at `i` of the whole list.
    pub fn item(&self, i: usize) -> Item {
        let (s, j) = (self.sessions.len(), self.jobs.len());
        if i < s {
            Item::Session(self.sessions[i].name.clone())
        } else if i < s + j {
            Item::Job(self.jobs[i - s].job_id().to_string())
        } else {
            Item::Loop(self.loops[i - s - j].id.clone())
        }
    }

    /// Where `item` is in the whole list.
    pub fn position(&self, item: &Item) -> Option<usize> {
        let (s, j) = (self.sessions.len(), self.jobs.len());
        match item {
            Item::Session(n) => self.sessions.iter().position(|x| &x.name == n),
            Item::Job(id) => self.jobs.iter().position(|x| x.job_id() == id).map(|p| p + s),
            Item::Loop(id) => self.loops.iter().position(|x| &x.id == id).map(|p| p + s + j),
        }
    }

    pub fn items(&self) -> Vec<Item> {
        (0..self.len()).map(|i| self.item(i)).collect()
    }
}

/// The rows `filter` keeps.
pub fn shown<'a>(world: &'a World, filter: &str) -> Shown<'a> {
    Shown {
        sessions: world
            .sessions
            .iter()
            .filter(|s| matches(filter, &[&s.name, &s.agent, &s.backend, &s.server, &s.pane, &s.state]))
            .collect(),
        jobs: world
            .jobs
            .iter()
            .filter(|j| matches(filter, &[j.job_id(), j.status(), j.session(), j.job_type(), j.reason().unwrap_or("")]))
            .collect(),
        // A loop matches its reviewers and their verdicts too (issue 32 item 6).
        loops: world
            .loops
            .iter()
            .filter(|l| {
                matches(filter, &[&l.id, &l.state, &l.phase, &l.creator])
                    || l.reviewers.iter().any(|(s, v)| matches(filter, &[s, v]))
            })
            .collect(),
    }
}

/// The rows the filter keeps, in screen order: sessions, jobs, loops.
pub fn items(world: &World, filter: &str) -> Vec<Item> {
    shown(world, filter).items()
}

impl App {
    /// The selection made valid for `items`: kept when its row is still there, else the row now at
    /// its old position (the last one past the end), else none.
    pub fn settle(&mut self, items: &[Item]) {
        let pos = self.sel.as_ref().and_then(|s| items.iter().position(|x| x == s));
        self.settle_in(items.len(), pos, |i| items[i].clone());
    }

    /// `settle` over a list of `len` rows where the selection is at `pos` (`item_at` names a row).
    pub fn settle_in(&mut self, len: usize, pos: Option<usize>, item_at: impl Fn(usize) -> Item) {
        if let Some(i) = pos.filter(|_| self.sel.is_some()) {
            self.sel_index = i;
            return;
        }
        if len == 0 {
            self.sel = None;
            return;
        }
        self.sel_index = self.sel_index.min(len - 1);
        self.sel = Some(item_at(self.sel_index));
    }

    fn move_by(&mut self, items: &[Item], delta: isize) {
        self.settle(items);
        if items.is_empty() {
            return;
        }
        let i = (self.sel_index as isize + delta).clamp(0, items.len() as isize - 1) as usize;
        self.sel_index = i;
        self.sel = Some(items[i].clone());
    }

    /// Shows `text` in the footer until `until_ms`.
    pub fn say(&mut self, text: impl Into<String>, until_ms: u64) {
        self.message = Some((text.into(), until_ms));
    }

    /// Asks for the confirmation of `what` with `prompt`.
    pub fn confirm(&mut self, what: StopWhat, prompt: String) {
        self.mode = Mode::Confirm(what, prompt);
    }

    /// One key. `items` is the list as it is on the screen.
    pub fn key(&mut self, key: Key, items: &[Item]) -> Action {
        if key == Key::Interrupt {
            return Action::Quit;
        }
        let page = self.page.max(1) as isize;
        match &mut self.mode {
            Mode::Help => {
                self.mode = Mode::List;
                Action::None
            }
            Mode::Filter => {
                match key {
                    Key::Enter => self.mode = Mode::List,
                    Key::Esc => {
                        self.filter.clear();
                        self.mode = Mode::List;
                    }
                    Key::Backspace => {
                        self.filter.pop();
                    }
                    Key::Char(c) => self.filter.push(c),
                    Key::Up | Key::Down => {
                        self.mode = Mode::List;
                        return self.key(key, items);
                    }
                    _ => {}
                }
                Action::None
            }
            Mode::Confirm(what, _) => {
                let what = what.clone();
                self.mode = Mode::List;
                match key {
                    Key::Char('y') | Key::Char('Y') => Action::Stop(what),
                    _ => {
                        self.message = Some(("not stopped".into(), u64::MAX));
                        Action::None
                    }
                }
            }
            Mode::View(p) => {
                let n = p.wrapped.as_ref().map_or(p.lines.len(), |(_, w)| w.len()) as isize;
                let top = p.top as isize;
                let new_top = match key {
                    Key::Char('q') | Key::Esc | Key::Backspace | Key::Char('h') => {
                        self.mode = Mode::List;
                        return Action::None;
                    }
                    Key::Down | Key::Char('j') | Key::Enter => top + 1,
                    Key::Up | Key::Char('k') => top - 1,
                    Key::PageDown | Key::Char(' ') => top + page,
                    Key::PageUp | Key::Char('b') => top - page,
                    Key::Home | Key::Char('g') => 0,
                    Key::End | Key::Char('G') => n,
                    _ => top,
                };
                let max_top = (n - page).max(0);
                p.top = new_top.clamp(0, max_top) as usize;
                if p.follow.is_some() {
                    p.at_end = new_top >= max_top;
                }
                Action::None
            }
            Mode::List => {
                self.message = None;
                match key {
                    Key::Char('q') => Action::Quit,
                    Key::Esc => {
                        self.filter.clear();
                        Action::None
                    }
                    Key::Down | Key::Char('j') => {
                        self.move_by(items, 1);
                        Action::None
                    }
                    Key::Up | Key::Char('k') => {
                        self.move_by(items, -1);
                        Action::None
                    }
                    Key::PageDown | Key::Char(' ') => {
                        self.move_by(items, page);
                        Action::None
                    }
                    Key::PageUp | Key::Char('b') => {
                        self.move_by(items, -page);
                        Action::None
                    }
                    Key::Home | Key::Char('g') => {
                        self.move_by(items, isize::MIN / 2);
                        Action::None
                    }
                    Key::End | Key::Char('G') => {
                        self.move_by(items, isize::MAX / 2);
                        Action::None
                    }
                    Key::Char('?') => {
                        self.mode = Mode::Help;
                        Action::None
                    }
                    Key::Char('/') => {
                        self.mode = Mode::Filter;
                        Action::None
                    }
                    Key::Enter | Key::Char('r') | Key::Char('l') | Key::Char('s') => {
                        self.settle(items);
                        let Some(sel) = self.sel.clone() else { return Action::None };
                        match key {
                            Key::Enter => Action::Jump(sel),
                            Key::Char('r') => Action::Report(sel),
                            Key::Char('l') => Action::Events(sel),
                            _ => Action::AskStop(sel),
                        }
                    }
                    _ => Action::None,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(n: usize) -> Vec<Item> {
        (0..n).map(|i| Item::Job(format!("j{i}"))).collect()
    }

    #[test]
    fn moving_keeps_the_row_and_clamps() {
        let mut a = App::default();
        let items = list(5);
        a.settle(&items);
        assert_eq!(a.sel, Some(Item::Job("j0".into())));
        a.key(Key::Char('j'), &items);
        a.key(Key::Down, &items);
        assert_eq!(a.sel, Some(Item::Job("j2".into())));
        a.key(Key::Char('G'), &items);
        assert_eq!(a.sel_index, 4);
        a.key(Key::Char('k'), &items);
        assert_eq!(a.sel, Some(Item::Job("j3".into())));
        // j3 goes away: the row now at its place is selected; it comes back elsewhere: followed.
        let fewer: Vec<Item> = items.iter().filter(|i| **i != Item::Job("j3".into())).cloned().collect();
        a.settle(&fewer);
        assert_eq!(a.sel, Some(Item::Job("j4".into())));
        let moved = vec![Item::Job("j4".into()), Item::Job("j0".into())];
        a.settle(&moved);
        assert_eq!(a.sel_index, 0);
        a.page = 2;
        a.key(Key::Home, &items);
        a.key(Key::PageDown, &items);
        assert_eq!(a.sel, Some(Item::Job("j2".into())));
    }

    #[test]
    fn modes() {
        let mut a = App::default();
        let items = list(2);
        assert_eq!(a.key(Key::Char('?'), &items), Action::None);
        assert_eq!(a.mode, Mode::Help);
        a.key(Key::Char('x'), &items);
        assert_eq!(a.mode, Mode::List);
        a.key(Key::Char('/'), &items);
        for c in "j1x".chars() {
            a.key(Key::Char(c), &items);
        }
        a.key(Key::Backspace, &items);
        assert_eq!(a.filter, "j1");
        a.key(Key::Enter, &items);
        assert_eq!((a.mode.clone(), a.filter.as_str()), (Mode::List, "j1"));
        a.key(Key::Esc, &items);
        assert_eq!(a.filter, "");
        assert_eq!(a.key(Key::Enter, &items), Action::Jump(Item::Job("j0".into())));
        assert_eq!(a.key(Key::Char('s'), &items), Action::AskStop(Item::Job("j0".into())));
        a.confirm(StopWhat::Job("j0".into()), "cancel?".into());
        assert_eq!(a.key(Key::Char('n'), &items), Action::None);
        assert_eq!(a.mode, Mode::List);
        a.confirm(StopWhat::Job("j0".into()), "cancel?".into());
        assert_eq!(a.key(Key::Char('y'), &items), Action::Stop(StopWhat::Job("j0".into())));
        assert_eq!(a.key(Key::Char('q'), &items), Action::Quit);
        a.mode = Mode::Filter;
        assert_eq!(a.key(Key::Interrupt, &items), Action::Quit);
    }

    #[test]
    fn a_view_scrolls_and_follows() {
        let mut a = App { page: 3, ..App::default() };
        let lines: Vec<String> = (0..10).map(|i| format!("l{i}")).collect();
        let mut p = Pager::new("t".into(), lines, Some("j".into()));
        p.wrapped(80);
        a.mode = Mode::View(p);
        a.key(Key::Char('G'), &[]);
        let Mode::View(p) = &a.mode else { panic!() };
        assert_eq!((p.top, p.at_end), (7, true));
        a.key(Key::Char('k'), &[]);
        let Mode::View(p) = &a.mode else { panic!() };
        assert_eq!((p.top, p.at_end), (6, false));
        a.key(Key::Char('q'), &[]);
        assert_eq!(a.mode, Mode::List);
        let mut p = Pager::new("t".into(), vec!["abcdef".into()], None);
        assert_eq!(p.wrapped(4), ["abcd", "ef"]);
    }
}
