//! `mam ui`'s screen (issue 22), below the command that runs it: screen cells and styled lines
//! (`ui::cells`), keys (`ui::keys`), the state machine of the keys (`ui::app`), the drawing of the
//! whole screen from the view data (`ui::draw`), the diffed redraw (`ui::screen`), the text views
//! of the `r` and `l` keys (`ui::pages`) and the terminal's raw mode with its restore on every
//! exit path (`ui::term`).
//!
//! Only `ui::term` touches the terminal (its mode and control sequences); everything else is pure
//! or read-only.

pub mod app;
pub mod cells;
pub mod draw;
pub mod keys;
pub mod pages;
pub mod screen;
pub mod term;
