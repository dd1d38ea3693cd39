//! The one integer-knob grammar (CORE 1.6, ORCH 0.3) used by every integer flag and env var.
//!
//! Optional ASCII spaces or tabs, ASCII digits, optional ASCII spaces or tabs, nothing else; the
//! value fits a u32 and meets the knob's minimum. An explicitly empty flag is invalid; an empty env
//! var counts as absent. An invalid env value is shown with where it came from, unless it is a secret
//! (issue 18, amending CORE 1.6).

use std::ffi::OsStr;
use std::fmt;

use crate::ctx::Ctx;
use crate::text::one_line;

/// A flag or variable with a value outside its grammar. `cmd` renders it as `ERROR: <this>` with
/// exit 2. A flag's value is echoed; a variable's value is echoed with where it came from (the
/// environment or `<env file>:<line>`, issue 18), except a secret's (`ctx::SECRET_VARS`), which is
/// never shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// `--flag` or `VARIABLE`.
    pub name: String,
    /// The offending value (a flag's, or a variable's that is not a secret).
    pub value: Option<String>,
    /// What was expected, e.g. `a decimal integer >= 1`.
    pub expected: String,
    /// A variable's: where its value came from, and what it should have been (`a port`). Boxed:
    /// the error travels inside larger error enums.
    pub origin: Option<Box<(String, String)>>,
}

impl ConfigError {
    /// A variable's bad value, named with its value (unless a secret) and its origin in `ctx`.
    /// `what` is the noun it should have been (`a port`), `expected` the grammar.
    pub fn var(ctx: &Ctx, name: &str, what: &str, expected: impl Into<String>) -> ConfigError {
        let secret = crate::ctx::SECRET_VARS.contains(&name);
        let value = if secret { None } else { ctx.var(name) };
        let origin = ctx.var_origin(name).unwrap_or_else(|| "the environment".into());
        ConfigError {
            name: name.into(),
            value,
            expected: expected.into(),
            origin: Some(Box::new((origin, what.into()))),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.origin.as_deref(), &self.value) {
            (None, Some(v)) => write!(f, "{}: invalid value '{}' (expected {})", self.name, one_line(v), self.expected),
            (None, None) => write!(f, "{}: invalid value (expected {})", self.name, self.expected),
            (Some((origin, what)), Some(v)) => {
                // The usual slip in an env file: a trailing comment, which is part of the value.
                let hint = if v.contains('#') { "; comments must be on their own line" } else { "" };
                write!(
                    f,
                    "{}: '{}' from {origin} is not {what} (expected {}{hint})",
                    self.name,
                    one_line(v),
                    self.expected
                )
            }
            (Some((origin, what)), None) => write!(
                f,
                "{}: the value from {origin} is not {what} (expected {}; a secret, so not shown)",
                self.name, self.expected
            ),
        }
    }
}

/// The grammar alone: `Some(n)` for a valid decimal u32, else `None`.
pub fn parse_u32(s: &str) -> Option<u32> {
    let t = s.trim_matches(|c| c == ' ' || c == '\t');
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<u32>().ok()
}

/// `digits` or `digits.digits`, surrounded by optional ASCII blanks, as milliseconds
/// (`MAM_HEARTBEAT_DRAIN_S`, CORE 1.6).
pub fn parse_decimal_ms(s: &str) -> Option<u64> {
    let t = s.trim_matches(|c| c == ' ' || c == '\t');
    let (int, frac) = match t.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (t, None),
    };
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = int.parse::<u32>().ok()? as u64;
    let mut ms = whole * 1000;
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut digits: String = f.chars().take(3).collect();
        while digits.len() < 3 {
            digits.push('0');
        }
        ms += digits.parse::<u64>().ok()?;
    }
    Some(ms)
}

/// A flag's value: `--flag: invalid value '<v>' (expected a decimal integer >= min)`.
pub fn flag(name: &str, raw: &OsStr, min: u32) -> Result<u32, ConfigError> {
    match raw.to_str().and_then(parse_u32) {
        Some(n) if n >= min => Ok(n),
        _ => Err(ConfigError {
            name: name.into(),
            value: Some(raw.to_string_lossy().into_owned()),
            expected: format!("a decimal integer >= {min}"),
            origin: None,
        }),
    }
}

/// An env var's value: absent or empty gives `None`; invalid names the variable, its value and where
/// it came from.
pub fn env(ctx: &Ctx, name: &str, min: u32) -> Result<Option<u32>, ConfigError> {
    let Some(v) = ctx.var_nonempty(name) else {
        return Ok(None);
    };
    match parse_u32(&v) {
        Some(n) if n >= min => Ok(Some(n)),
        _ => Err(ConfigError::var(ctx, name, "a whole number", format!("digits only, at least {min}"))),
    }
}

/// `env`, with a default when absent.
pub fn env_or(ctx: &Ctx, name: &str, min: u32, default: u32) -> Result<u32, ConfigError> {
    Ok(env(ctx, name, min)?.unwrap_or(default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e14_grammar() {
        assert_eq!(parse_u32("30"), Some(30));
        assert_eq!(parse_u32(" 30 "), Some(30));
        assert_eq!(parse_u32("\t30\t"), Some(30));
        for bad in ["", " ", "\u{2003} 30\u{2003}", "３０", "+30", "-1", "3x", "4294967296", "3 0"] {
            assert_eq!(parse_u32(bad), None, "{bad:?}");
        }
        assert_eq!(parse_u32("4294967295"), Some(u32::MAX));
    }

    #[test]
    fn decimal_seconds() {
        assert_eq!(parse_decimal_ms("1"), Some(1000));
        assert_eq!(parse_decimal_ms("0.25"), Some(250));
        assert_eq!(parse_decimal_ms(" 2.5 "), Some(2500));
        for bad in ["", ".5", "1.", "1.x", "-1", "1e3"] {
            assert_eq!(parse_decimal_ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn flag_message_names_flag_and_value() {
        let e = flag("--heartbeat", OsStr::new(""), 1).unwrap_err();
        assert_eq!(e.to_string(), "--heartbeat: invalid value '' (expected a decimal integer >= 1)");
        assert_eq!(flag("--heartbeat", OsStr::new(" 5 "), 1).unwrap(), 5);
        assert!(flag("--heartbeat", OsStr::new("0"), 1).is_err());
    }

    /// Issue 18: a variable's error names its value and its origin; a secret's value never shows.
    #[test]
    fn var_message_names_value_and_origin_but_never_a_secret() {
        let mut ctx = Ctx::with_env([("MAM_HEARTBEAT_SEC", "3x")], std::path::Path::new("/"));
        ctx.apply_overlay(vec![
            ("MQTT_PORT".into(), "33581 # my broker".into()),
            ("MQTT_PASSWORD".into(), "hunter2".into()),
        ]);
        ctx.note_origins(vec![
            ("MQTT_PORT".into(), ".mam.env:3".into()),
            ("MQTT_PASSWORD".into(), ".mam.env:4".into()),
        ]);
        assert_eq!(
            ConfigError::var(&ctx, "MQTT_PORT", "a port", "digits only, 1-65535").to_string(),
            "MQTT_PORT: '33581 # my broker' from .mam.env:3 is not a port (expected digits only, 1-65535; comments must be on their own line)"
        );
        assert_eq!(
            env(&ctx, "MAM_HEARTBEAT_SEC", 1).unwrap_err().to_string(),
            "MAM_HEARTBEAT_SEC: '3x' from the environment is not a whole number (expected digits only, at least 1)"
        );
        let e = ConfigError::var(&ctx, "MQTT_PASSWORD", "valid", "x").to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("from .mam.env:4") && e.contains("not shown"), "{e}");
    }
}
