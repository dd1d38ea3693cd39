//! `mam bench`'s measuring parts (issue 20, docs/PERFORMANCE.md): whole processes timed against
//! anchors measured in the same run (`measure`), registries to list (`fixture`), a load generator
//! for the brokers (`load`), fan-in and fan-out with the mosquitto clients (`fan`), and the table itself (`Row`, `Report`): its rows as readable text and
//! as JSON. The rows are decided and run by `cmd::bench`; nothing here prints.

pub mod fan;
pub mod fixture;
pub mod load;
pub mod measure;

use serde_json::{json, Value};

/// A measured quantity with its unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Qty {
    pub value: f64,
    pub unit: Unit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Ms,
    Us,
    /// Mebibytes.
    MiB,
    /// Bytes, shown in MB (10^6).
    Bytes,
    PerS,
    /// A plain ratio.
    Times,
    /// A share (1.0 = 100%), shown in percent.
    Percent,
}

impl Qty {
    pub fn ms(v: f64) -> Qty {
        Qty { value: v, unit: Unit::Ms }
    }
    pub fn us(v: f64) -> Qty {
        Qty { value: v, unit: Unit::Us }
    }
    pub fn kib(v: u64) -> Qty {
        Qty { value: v as f64 / 1024.0, unit: Unit::MiB }
    }
    pub fn bytes(v: u64) -> Qty {
        Qty { value: v as f64, unit: Unit::Bytes }
    }
    pub fn per_s(v: f64) -> Qty {
        Qty { value: v, unit: Unit::PerS }
    }
    pub fn times(v: f64) -> Qty {
        Qty { value: v, unit: Unit::Times }
    }
    pub fn percent(share: f64) -> Qty {
        Qty { value: share, unit: Unit::Percent }
    }

    fn unit_name(self) -> &'static str {
        match self.unit {
            Unit::Ms => "ms",
            Unit::Us => "us",
            Unit::MiB => "MiB",
            Unit::Bytes => "bytes",
            Unit::PerS => "msg/s",
            Unit::Times => "x",
            Unit::Percent => "share",
        }
    }
}

impl std::fmt::Display for Qty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.value;
        match self.unit {
            Unit::Ms if v >= 100.0 => write!(f, "{v:.0} ms"),
            Unit::Ms if v >= 10.0 => write!(f, "{v:.1} ms"),
            Unit::Ms => write!(f, "{v:.2} ms"),
            Unit::Us => write!(f, "{v:.1} us"),
            Unit::MiB => write!(f, "{v:.1} MiB"),
            Unit::Bytes => write!(f, "{:.2} MB", v / 1e6),
            Unit::PerS => write!(f, "{v:.0} msg/s"),
            Unit::Times => write!(f, "{v:.2}x"),
            Unit::Percent => write!(f, "{:.0}%", v * 100.0),
        }
    }
}

/// One line of the table. `id` is stable (for `--json` readers and the tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: String,
    pub measure: String,
    pub now: Option<Qty>,
    /// What the anchor is, and its value in this run.
    pub anchor: Option<(String, Qty)>,
    pub ratio: Option<f64>,
    /// The target in words (`<= 1.0`, `<= 64 MiB`), `-` for a row shown for the record.
    pub target: String,
    /// Met, not met, or `None` (no target, or not measured).
    pub pass: Option<bool>,
    /// Why a row was not measured, or what qualifies it.
    pub note: String,
    /// The samples behind the row (per run, per side), for `--json` readers; None for most rows.
    pub detail: Option<Value>,
}

impl Row {
    pub fn new(id: impl Into<String>, measure: impl Into<String>) -> Row {
        Row {
            id: id.into(),
            measure: measure.into(),
            now: None,
            anchor: None,
            ratio: None,
            target: "-".into(),
            pass: None,
            note: String::new(),
            detail: None,
        }
    }

    /// The row of a measure that could not be taken.
    pub fn skipped(id: impl Into<String>, measure: impl Into<String>, target: &str, why: impl Into<String>) -> Row {
        Row { target: target.into(), note: why.into(), ..Row::new(id, measure) }
    }

    fn result(&self) -> &'static str {
        match self.pass {
            Some(true) => "met",
            Some(false) => "NOT met",
            None if self.now.is_none() => "not measured",
            None => "-",
        }
    }

    /// The row as one sentence.
    pub fn sentence(&self) -> String {
        let Some(now) = self.now else {
            return format!("{}: not measured ({}).", self.measure, self.note);
        };
        let mut s = format!("{}: {now}", self.measure);
        if let Some((what, a)) = &self.anchor {
            s.push_str(&format!(", {what} {a}"));
        }
        if let Some(r) = self.ratio {
            s.push_str(&format!(", ratio {r:.2}"));
        }
        if self.target != "-" {
            s.push_str(&format!("; target {}: {}", self.target, self.result()));
        }
        if !self.note.is_empty() {
            s.push_str(&format!(" ({})", self.note));
        }
        s.push('.');
        s
    }

    pub fn json(&self) -> Value {
        let q = |q: &Qty| json!({"value": q.value, "unit": q.unit_name()});
        json!({
            "id": self.id,
            "measure": self.measure,
            "now": self.now.as_ref().map(q),
            "anchor": self.anchor.as_ref().map(|(w, a)| json!({"what": w, "value": a.value, "unit": a.unit_name()})),
            "ratio": self.ratio,
            "target": self.target,
            "pass": self.pass,
            "note": self.note,
            "detail": self.detail,
        })
    }
}

/// The machine a run was measured on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    pub cores: usize,
    pub kernel: String,
    pub load_start: Option<[f64; 3]>,
    pub load_end: Option<[f64; 3]>,
    /// Where the fixtures and registries were written.
    pub tmp: String,
    pub mosquitto: Option<String>,
}

/// A whole run: how it was asked for, the machine, the rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub command: String,
    pub version: String,
    pub machine: Machine,
    pub rows: Vec<Row>,
}

fn load_words(l: Option<[f64; 3]>) -> String {
    l.map_or_else(|| "unknown".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"))
}

impl Report {
    /// The table, then the rows as sentences.
    pub fn text(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "{} (mam {}): {} cores, Linux {}, load {} at the start and {} at the end (1/5/15 min); \
             files under {}; mosquitto: {}\n\n",
            self.command,
            self.version,
            m.cores,
            m.kernel,
            load_words(m.load_start),
            load_words(m.load_end),
            m.tmp,
            m.mosquitto.as_deref().unwrap_or("not installed (its rows are not measured)")
        );
        let head = ["measure", "now", "anchor", "ratio", "target", "result"].map(String::from);
        let mut cells = vec![head];
        for r in &self.rows {
            cells.push([
                r.measure.clone(),
                r.now.map_or_else(|| "-".into(), |q| q.to_string()),
                r.anchor.as_ref().map_or_else(|| "-".into(), |(w, a)| format!("{w} {a}")),
                r.ratio.map_or_else(|| "-".into(), |x| format!("{x:.2}")),
                r.target.clone(),
                r.result().to_string(),
            ]);
        }
        let mut width = [0usize; 6];
        for c in &cells {
            for (w, s) in width.iter_mut().zip(c) {
                *w = (*w).max(s.chars().count());
            }
        }
        for c in &cells {
            let mut line = String::new();
            for (i, s) in c.iter().enumerate() {
                line.push_str(s);
                if i + 1 < c.len() {
                    line.extend(std::iter::repeat_n(' ', width[i] - s.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&r.sentence());
            out.push('\n');
        }
        out
    }

    pub fn json(&self) -> Value {
        let m = &self.machine;
        json!({
            "command": self.command,
            "version": self.version,
            "machine": {
                "cores": m.cores, "kernel": m.kernel, "load_start": m.load_start, "load_end": m.load_end,
                "tmp": m.tmp, "mosquitto": m.mosquitto,
            },
            "rows": self.rows.iter().map(Row::json).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_as_sentences() {
        let mut r = Row::new("version", "mam --version / /bin/true");
        r.now = Some(Qty::ms(0.512));
        r.anchor = Some(("/bin/true".into(), Qty::ms(0.4)));
        r.ratio = Some(1.28);
        r.target = "<= 1.3".into();
        r.pass = Some(true);
        assert_eq!(
            r.sentence(),
            "mam --version / /bin/true: 0.51 ms, /bin/true 0.40 ms, ratio 1.28; target <= 1.3: met."
        );
        let s = Row::skipped("pub", "mam pub -q 1", "<= 0.6", "mosquitto_pub is not installed");
        assert_eq!(s.sentence(), "mam pub -q 1: not measured (mosquitto_pub is not installed).");
        assert_eq!(s.json()["pass"], Value::Null);
        assert_eq!(Qty::bytes(3_464_648).to_string(), "3.46 MB");
        assert_eq!(Qty::kib(4028).to_string(), "3.9 MiB");
        assert_eq!(Qty::percent(0.354).to_string(), "35%");
    }
}
