//! Canonical JSON bytes and HMAC-SHA256 signatures (CORE 6.2, 9.2): the one place that decides which
//! bytes are signed, so the signer, every verifier and the Python oracle agree byte for byte.
//!
//! Owns: the hand-written canonical serializer (Python
//! `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`), `sign`/`verify` over
//! "payload minus top-level `sig`", and the remote auth_token derivation. It never prints, never reads the
//! environment, never uses serde_json's own output (which differs from the oracle), and never puts a key,
//! a secret or a signature into an error message.
//!
//! Integration tests: sign (vectors produced by `scripts/gen_sign_vectors.py` in `tests/vectors/`).

use std::fmt;

use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

use crate::sys;

type HmacSha256 = Hmac<Sha256>;

/// The top-level field that carries the signature and is left out of the signed bytes.
pub const SIG_FIELD: &str = "sig";

/// Why a value has no canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonError {
    /// A number that is not an integer (serde_json `Number` that is neither i64 nor u64). `path` is a
    /// `$`-rooted location such as `$.data.ratio` or `$.items[2]`.
    ///
    /// Two integer spellings Python would accept land here too, deliberately: serde_json parses `-0` as
    /// the float -0.0, and integers outside `[i64::MIN, u64::MAX]` as floats. mam never writes either (its
    /// integers are seqs, attempts and timings), so a payload holding one did not come from mam and is
    /// refused rather than re-spelled.
    Float { path: String },
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CanonError::Float { path } => {
                write!(f, "non-integer number at {path}: canonical JSON allows integers only")
            }
        }
    }
}

impl std::error::Error for CanonError {}

/// Why a payload failed verification. Messages never contain the key or the signature value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// The payload is not a JSON object.
    NotObject,
    /// There is no top-level `sig`.
    MissingSig,
    /// `sig` is not a string of 64 lowercase hex digits.
    MalformedSig,
    /// The rest of the payload has no canonical form.
    Canon(CanonError),
    /// The HMAC does not match.
    Mismatch,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::NotObject => f.write_str("payload is not a JSON object"),
            VerifyError::MissingSig => f.write_str("payload has no sig"),
            VerifyError::MalformedSig => f.write_str("sig is not 64 lowercase hex digits"),
            VerifyError::Canon(e) => write!(f, "payload is not canonicalisable: {e}"),
            VerifyError::Mismatch => f.write_str("bad signature"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// The canonical bytes of `v` (CORE 6.2). Always ASCII.
pub fn canonical(v: &Value) -> Result<Vec<u8>, CanonError> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, v, None)?;
    Ok(out)
}

/// The canonical bytes of `v` with the top-level `sig` left out (objects only; other values are whole).
pub fn canonical_unsigned(v: &Value) -> Result<Vec<u8>, CanonError> {
    let mut out = Vec::with_capacity(256);
    write_value(&mut out, v, Some(SIG_FIELD))?;
    Ok(out)
}

/// Lowercase hex HMAC-SHA256 of `data` under `key`.
pub fn hmac_hex(key: &[u8], data: &[u8]) -> String {
    let mut mac = new_mac(key);
    mac.update(data);
    sys::hex(&mac.finalize().into_bytes())
}

/// `hex(HMAC-SHA256(key, canonical(payload minus top-level "sig")))`.
pub fn sign(key: &[u8], payload: &Value) -> Result<String, CanonError> {
    Ok(hmac_hex(key, &canonical_unsigned(payload)?))
}

/// `obj` with its `sig` (re)computed and stored as the last field.
pub fn signed(key: &[u8], mut obj: Map<String, Value>) -> Result<Value, CanonError> {
    obj.remove(SIG_FIELD);
    let mut v = Value::Object(obj);
    let sig = sign(key, &v)?;
    if let Value::Object(m) = &mut v {
        m.insert(SIG_FIELD.to_string(), Value::String(sig));
    }
    Ok(v)
}

/// True when `payload` is an object whose `sig` is the HMAC of the rest under `key`.
pub fn verify(key: &[u8], payload: &Value) -> bool {
    verify_detail(key, payload).is_ok()
}

/// Like [`verify`], with the reason for a failure. Parsing, and checking `v` and `kind`, is the caller's job.
pub fn verify_detail(key: &[u8], payload: &Value) -> Result<(), VerifyError> {
    let Value::Object(map) = payload else { return Err(VerifyError::NotObject) };
    let sig = match map.get(SIG_FIELD) {
        None => return Err(VerifyError::MissingSig),
        Some(Value::String(s)) => s,
        Some(_) => return Err(VerifyError::MalformedSig),
    };
    let tag = decode_sig(sig).ok_or(VerifyError::MalformedSig)?;
    let bytes = canonical_unsigned(payload).map_err(VerifyError::Canon)?;
    let mut mac = new_mac(key);
    mac.update(&bytes);
    // verify_slice compares in constant time (subtle::ConstantTimeEq inside hmac).
    mac.verify_slice(&tag).map_err(|_| VerifyError::Mismatch)
}

/// The auth_token of a remote job (CORE 9.2):
/// `hex(HMAC-SHA256(secret, "mam-auth\n<job_id>\n<attempt>\n<dispatch_token>"))`.
pub fn derive_remote_auth_token(secret: &[u8], job_id: &str, attempt: u64, dispatch_token: &str) -> String {
    let msg = format!("mam-auth\n{job_id}\n{attempt}\n{dispatch_token}");
    hmac_hex(secret, msg.as_bytes())
}

fn new_mac(key: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        // HMAC hashes long keys and pads short ones: every key length is valid.
        Err(_) => unreachable!("HMAC-SHA256 accepts keys of any length"),
    }
}

/// 64 lowercase hex digits to 32 bytes. Uppercase is rejected: every signer emits lowercase, and one
/// spelling per signature keeps captured payloads comparable byte for byte.
fn decode_sig(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// Writes `v`; `skip` names a key left out of this (top-level) object only.
fn write_value(out: &mut Vec<u8>, v: &Value, skip: Option<&str>) -> Result<(), CanonError> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            // Without serde_json's arbitrary_precision, a Number is exactly one of i64, u64, f64, so
            // every JSON integer in [i64::MIN, u64::MAX] lands here and prints as Python prints an int.
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else {
                return Err(CanonError::Float { path: "$".to_string() });
            }
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item, None).map_err(|e| nest(e, &format!("[{i}]")))?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // serde_json is built with `preserve_order` here, so iteration is insertion order: sort
            // explicitly. Python's sort_keys orders str keys by code point; Rust's `str` Ord compares the
            // UTF-8 bytes, and UTF-8 was designed so that byte order equals code point order (a lead byte
            // encodes the length, and longer encodings start with larger lead bytes). JSON text cannot
            // hold a lone surrogate that serde_json would accept, so the two orders agree on every key.
            let mut entries: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| Some(k.as_str()) != skip).collect();
            crate::sort::by(&mut entries, |a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(out, k);
                out.push(b':');
                write_value(out, val, None).map_err(|e| nest(e, &format!(".{k}")))?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Prefixes a path segment as the error unwinds out of a container.
fn nest(e: CanonError, seg: &str) -> CanonError {
    match e {
        CanonError::Float { path } => CanonError::Float { path: format!("${seg}{}", &path[1..]) },
    }
}

/// Python's `ensure_ascii` string encoder: `"` `\` and the five short forms escaped, printable ASCII
/// (0x20-0x7E, `/` included) as is, everything else `\uxxxx` in lowercase hex, astral characters as a
/// UTF-16 surrogate pair.
fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Copy runs of plain ASCII in one go: typical payloads are mostly plain.
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let plain = (' '..='~').contains(&c) && c != '"' && c != '\\';
        if plain {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        start = i + c.len_utf8();
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    push_u_escape(out, *u);
                }
            }
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn push_u_escape(out: &mut Vec<u8>, u: u16) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b"\\u");
    for shift in [12, 8, 4, 0] {
        out.push(DIGITS[((u >> shift) & 0xf) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon_str(v: &Value) -> String {
        String::from_utf8(canonical(v).unwrap()).unwrap()
    }

    #[test]
    fn short_escapes_and_quotes() {
        let v = json!("a\"b\\c\u{8}\u{c}\n\r\t/");
        assert_eq!(canon_str(&v), r#""a\"b\\c\b\f\n\r\t/""#);
    }

    #[test]
    fn control_and_del_use_lowercase_u_escapes() {
        let v = json!("\u{0}\u{1}\u{1f}\u{7f}\u{80}\u{ab}");
        assert_eq!(canon_str(&v), r#""\u0000\u0001\u001f\u007f\u0080\u00ab""#);
    }

    #[test]
    fn bmp_and_astral_characters() {
        // é, U+2028, U+FFFF, U+1F600 (surrogate pair d83d de00), U+10FFFF (dbff dfff).
        let v = json!("\u{e9}\u{2028}\u{ffff}\u{1f600}\u{10ffff}");
        assert_eq!(canon_str(&v), r#""\u00e9\u2028\uffff\ud83d\ude00\udbff\udfff""#);
    }

    #[test]
    fn printable_ascii_is_untouched() {
        let all: String = (0x20u8..=0x7e).map(char::from).filter(|c| *c != '"' && *c != '\\').collect();
        assert_eq!(canon_str(&Value::String(all.clone())), format!("\"{all}\""));
    }

    #[test]
    fn keys_sorted_by_code_point_recursively() {
        // Insertion order is deliberately unsorted; "\u{e9}" (U+00E9) sorts after "z" and before U+2028,
        // and U+FFFF sorts before the astral U+1F600 (UTF-16 order would put the surrogates first).
        let v: Value =
            serde_json::from_str(r#"{"\ud83d\ude00":1,"\uffff":2,"z":{"b":1,"a":[{"y":0,"x":0}]},"é":3,"ab":4,"a":5}"#)
                .unwrap();
        assert_eq!(
            canon_str(&v),
            r#"{"a":5,"ab":4,"z":{"a":[{"x":0,"y":0}],"b":1},"\u00e9":3,"\uffff":2,"\ud83d\ude00":1}"#
        );
    }

    #[test]
    fn integers_literals_and_empty_containers() {
        let v = json!([u64::MAX, i64::MIN, 0, -1, true, false, null, {}, []]);
        assert_eq!(canon_str(&v), "[18446744073709551615,-9223372036854775808,0,-1,true,false,null,{},[]]");
    }

    #[test]
    fn floats_are_rejected_with_their_path() {
        let v: Value = serde_json::from_str(r#"{"a":{"b":[1,2.5]}}"#).unwrap();
        assert_eq!(canonical(&v), Err(CanonError::Float { path: "$.a.b[1]".to_string() }));
        for text in ["1.0", "-0", "18446744073709551616", "-9223372036854775809"] {
            let top: Value = serde_json::from_str(text).unwrap();
            assert_eq!(canonical(&top), Err(CanonError::Float { path: "$".to_string() }), "{text}");
        }
    }

    #[test]
    fn sign_ignores_only_top_level_sig() {
        let key = b"k";
        let with = json!({"a": 1, "sig": "x", "n": {"sig": "inner"}});
        let without = json!({"a": 1, "n": {"sig": "inner"}});
        assert_eq!(sign(key, &with).unwrap(), sign(key, &without).unwrap());
        assert_ne!(sign(key, &without).unwrap(), sign(key, &json!({"a": 1, "n": {}})).unwrap());
    }

    #[test]
    fn signed_then_verify_and_tamper() {
        let mut m = Map::new();
        m.insert("v".into(), json!(1));
        m.insert("kind".into(), json!("event"));
        let v = signed(b"key", m).unwrap();
        assert_eq!(v.as_object().unwrap().keys().next_back().map(String::as_str), Some("sig"));
        assert_eq!(verify_detail(b"key", &v), Ok(()));
        assert_eq!(verify_detail(b"other", &v), Err(VerifyError::Mismatch));
        let mut t = v.clone();
        t["kind"] = json!("state");
        assert_eq!(verify_detail(b"key", &t), Err(VerifyError::Mismatch));
        let mut upper = v.clone();
        upper["sig"] = json!(v["sig"].as_str().unwrap().to_uppercase());
        assert_eq!(verify_detail(b"key", &upper), Err(VerifyError::MalformedSig));
        let mut short = v.clone();
        short["sig"] = json!("ab");
        assert_eq!(verify_detail(b"key", &short), Err(VerifyError::MalformedSig));
        let mut num = v.clone();
        num["sig"] = json!(5);
        assert_eq!(verify_detail(b"key", &num), Err(VerifyError::MalformedSig));
        let mut none = v.clone();
        none.as_object_mut().unwrap().remove("sig");
        assert_eq!(verify_detail(b"key", &none), Err(VerifyError::MissingSig));
        assert_eq!(verify_detail(b"key", &json!([1])), Err(VerifyError::NotObject));
    }

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        assert_eq!(
            hmac_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
