//! Topic names and topic filters for the embedded broker (CORE 11.2): validation and matching as
//! pure functions over strings.
//!
//! It never touches sockets or broker state; the broker calls it under its state lock, so it must
//! stay allocation-free and cheap.

/// A publish topic is valid when it is non-empty and has no wildcard or NUL character.
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && !topic.bytes().any(|b| matches!(b, b'+' | b'#' | 0))
}

/// A filter is valid when it is non-empty, has no NUL, every `+` fills a whole level and a `#`
/// fills the last level.
pub fn valid_filter(filter: &str) -> bool {
    if filter.is_empty() || filter.contains('\0') {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('+') && level != "+" {
            return false;
        }
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return false;
        }
    }
    true
}

/// True when the (valid) `filter` matches the (valid) `topic`: `+` matches one level, empty
/// included; `a/#` matches `a` and everything below it; a filter starting with a wildcard never
/// matches a topic starting with `$`.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The QoS a client with subscriptions `subs` (filter, granted QoS) gets for a publish on `topic`
/// at `qos`: min(published, granted), taking the highest grant among overlapping filters (one copy,
/// CORE 11.2 Delivery); None when no filter matches.
pub fn delivery_qos(subs: &[(String, u8)], topic: &str, qos: u8) -> Option<u8> {
    subs.iter().filter(|(f, _)| matches(f, topic)).map(|(_, g)| *g).max().map(|g| g.min(qos))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K8: the wildcard table (filter, topic, expected).
    pub const K8_TABLE: &[(&str, &str, bool)] = &[
        ("a/+/c", "a/b/c", true),
        ("a/+/c", "a//c", true),
        ("a/+/c", "a/b/d", false),
        ("a/+/c", "a/b/c/d", false),
        ("a/+/c", "a/c", false),
        ("a/#", "a", true),
        ("a/#", "a/b", true),
        ("a/#", "a/b/c", true),
        ("a/#", "ab", false),
        ("a/#", "b/a", false),
        ("#", "a", true),
        ("#", "a/b/c", true),
        ("#", "/", true),
        ("#", "$SYS/x", false),
        ("+/+", "a/b", true),
        ("+/+", "/b", true),
        ("+/+", "a/", true),
        ("+/+", "/", true),
        ("+/+", "a", false),
        ("+/+", "a/b/c", false),
        ("+/+", "$SYS/x", false),
        ("+", "$SYS", false),
        ("$SYS/#", "$SYS/x", true),
        ("$SYS/+", "$SYS/x", true),
        ("a//c", "a//c", true),
        ("a//c", "a/b/c", false),
        ("a/+", "a//", false),
        ("a/b", "a/b", true),
        ("a/b", "a/b/", false),
        ("+/#", "a", true),
        ("/+", "/x", true),
    ];

    #[test]
    fn k8_wildcard_table() {
        for (f, t, want) in K8_TABLE {
            assert!(valid_filter(f), "{f} should be a valid filter");
            assert!(valid_topic_name(t), "{t} should be a valid topic");
            assert_eq!(matches(f, t), *want, "filter {f:?} topic {t:?}");
        }
    }

    #[test]
    fn delivery_qos_is_min_of_published_and_highest_grant() {
        let subs = vec![("a/#".to_string(), 0), ("a/+".to_string(), 1), ("b".to_string(), 1)];
        assert_eq!(delivery_qos(&subs, "a/x", 1), Some(1));
        assert_eq!(delivery_qos(&subs, "a/x", 0), Some(0));
        assert_eq!(delivery_qos(&subs, "a/x/y", 1), Some(0));
        assert_eq!(delivery_qos(&subs, "b", 1), Some(1));
        assert_eq!(delivery_qos(&subs, "c", 1), None);
        assert_eq!(delivery_qos(&[], "a", 1), None);
    }

    #[test]
    fn filter_validation() {
        for ok in ["a", "#", "+", "a/+", "+/a/#", "/", "//", "a//b", "$SYS/#", "+/+/+"] {
            assert!(valid_filter(ok), "{ok:?} should be valid");
        }
        for bad in ["", "a+", "a/b+", "+a/b", "a/#/b", "a#", "#/a", "a/##", "++", "a\0b"] {
            assert!(!valid_filter(bad), "{bad:?} should be invalid");
        }
    }

    #[test]
    fn topic_name_validation() {
        for ok in ["a", "/", "a/b", "$SYS/x", "a//b", " "] {
            assert!(valid_topic_name(ok), "{ok:?} should be valid");
        }
        for bad in ["", "a/+", "#", "a/#", "a+b", "x\0"] {
            assert!(!valid_topic_name(bad), "{bad:?} should be invalid");
        }
    }
}
