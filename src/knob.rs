//! The one integer-knob grammar (CORE 1.6, ORCH 0.3) used by every integer flag and env var.
//!
//! Optional ASCII spaces or tabs, ASCII digits, optional ASCII spaces or tabs, nothing else; the
//! value fits a u32 and meets the knob's minimum. An explicitly empty flag is invalid; an empty env
//! var counts as absent. Env values are never echoed (they may come from the env file).

use std::ffi::OsStr;
use std::fmt;

use crate::ctx::Ctx;
use crate::text::one_line;

/// A flag or variable with a value outside its grammar. `cmd` renders it as `ERROR: <this>` with
/// exit 2. Only a flag's value is echoed: an env value may come from the env file and is never shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// `--flag` or `VARIABLE`.
    pub name: String,
    /// The offending value, for flags only.
    pub value: Option<String>,
    /// What was expected, e.g. `a decimal integer >= 1`.
    pub expected: String,
}

impl ConfigError {
    /// A variable's bad value (not echoed).
    pub fn var(name: &str, expected: impl Into<String>) -> ConfigError {
        ConfigError { name: name.into(), value: None, expected: expected.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}: invalid value '{}' (expected {})", self.name, one_line(v), self.expected),
            None => write!(f, "{}: invalid value (expected {})", self.name, self.expected),
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
        }),
    }
}

/// An env var's value: absent or empty gives `None`; invalid names the variable only.
pub fn env(ctx: &Ctx, name: &str, min: u32) -> Result<Option<u32>, ConfigError> {
    let Some(v) = ctx.var_nonempty(name) else {
        return Ok(None);
    };
    match parse_u32(&v) {
        Some(n) if n >= min => Ok(Some(n)),
        _ => Err(ConfigError::var(name, format!("a decimal integer >= {min}"))),
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
}
