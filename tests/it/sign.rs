//! Integration tests: sign. Canonical bytes and HMACs against vectors produced by Python's `json.dumps`
//! oracle (`scripts/gen_sign_vectors.py`), tamper detection, and an HMAC check by `openssl dgst`, a
//! verifier that shares no code with the signer.

use std::io::Write;
use std::process::{Command, Stdio};

use mam::sign::{self, CanonError, VerifyError};
use serde_json::{json, Map, Value};

use crate::support::{have_tool, rand_hex};

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/canonical.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

fn field<'a>(v: &'a Value, name: &str) -> &'a str {
    v[name].as_str().unwrap_or_else(|| panic!("vector field {name} missing in {v}"))
}

#[test]
fn u11_canonical_vectors_match_python() {
    let doc = vectors();
    let cases = doc["vectors"].as_array().unwrap();
    assert!(cases.len() >= 20, "vector file looks truncated: {} cases", cases.len());
    for case in cases {
        let name = field(case, "name");
        let key = field(case, "key").as_bytes();
        let input = &case["input"];
        let full = sign::canonical(input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(String::from_utf8(full).unwrap(), field(case, "canonical_full"), "{name}: canonical bytes");
        let unsigned = sign::canonical_unsigned(input).unwrap();
        assert_eq!(String::from_utf8(unsigned).unwrap(), field(case, "canonical"), "{name}: signed bytes");
        let sig = sign::sign(key, input).unwrap();
        assert_eq!(sig, field(case, "sig"), "{name}: signature");
        if let Value::Object(m) = input {
            let resigned = sign::signed(key, m.clone()).unwrap();
            assert_eq!(resigned["sig"], json!(field(case, "sig")), "{name}: signed()");
            assert!(sign::verify(key, &resigned), "{name}: verify of its own signature");
        }
    }
}

#[test]
fn u11_vectors_cover_the_spec_characters() {
    // The spec names these; make sure the vector file keeps covering them.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/canonical.json")).unwrap();
    for needle in
        [r"\\u00e9", r"\\u2028", r"\\ud83d\\ude00", r#"\\\""#, r"\\n", r"\\t", r"\\u0001", r"\\u001f", r"\\u007f"]
    {
        assert!(text.contains(needle), "no vector produces {needle}");
    }
}

#[test]
fn u11_floats_are_rejected() {
    let doc = vectors();
    let rejects = doc["reject"].as_array().unwrap();
    assert!(!rejects.is_empty());
    let key = b"k";
    for text in rejects {
        let text = text.as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap();
        assert!(matches!(sign::canonical(&v), Err(CanonError::Float { .. })), "{text} was accepted");
        assert!(sign::sign(key, &v).is_err(), "{text} was signed");
    }
    // A float smuggled into an otherwise signed payload makes it unverifiable, not "valid".
    let mut m = Map::new();
    m.insert("v".into(), json!(1));
    let mut payload = sign::signed(key, m).unwrap();
    payload["ratio"] = serde_json::from_str("0.5").unwrap();
    assert!(matches!(sign::verify_detail(key, &payload), Err(VerifyError::Canon(_))));
}

#[test]
fn u11_remote_auth_token_vectors() {
    let doc = vectors();
    let cases = doc["auth_tokens"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let got = sign::derive_remote_auth_token(
            field(case, "secret").as_bytes(),
            field(case, "job_id"),
            case["attempt"].as_u64().unwrap(),
            field(case, "dispatch_token"),
        );
        assert_eq!(got, field(case, "token"), "auth token for {}", field(case, "job_id"));
    }
}

#[test]
fn u10_one_byte_change_fails_verification() {
    let doc = vectors();
    let event = doc["vectors"].as_array().unwrap().iter().find(|c| c["name"] == "event_payload").unwrap();
    let key = rand_hex(32);
    let Value::Object(m) = event["input"].clone() else { panic!("event input is not an object") };
    let signed = sign::signed(key.as_bytes(), m).unwrap();
    // The wire bytes as another mam would capture them (serde_json's own output is fine on the wire).
    let wire = serde_json::to_vec(&signed).unwrap();
    let parsed: Value = serde_json::from_slice(&wire).unwrap();
    assert_eq!(sign::verify_detail(key.as_bytes(), &parsed), Ok(()));

    // Change every byte position once (to a different byte that keeps the text parseable where possible):
    // each variant either fails to parse (dropped by the caller) or fails verification. A variant that
    // only changes the JSON spelling (whitespace) cannot occur here: serde_json emits none.
    let mut checked = 0;
    for i in 0..wire.len() {
        for repl in [b'0', b'1', b'a', b'x', b'"', b' '] {
            if wire[i] == repl {
                continue;
            }
            let mut t = wire.clone();
            t[i] = repl;
            let Ok(v) = serde_json::from_slice::<Value>(&t) else { continue };
            if v == parsed {
                continue; // e.g. a space replacing insignificant whitespace: same value, same bytes signed
            }
            checked += 1;
            assert!(!sign::verify(key.as_bytes(), &v), "byte {i} -> {:?} still verifies", repl as char);
        }
    }
    assert!(checked > wire.len(), "too few parseable variants: {checked}");

    // Also a wrong key, and a sig moved from one kind to another (kind is inside the signed bytes).
    assert!(!sign::verify(rand_hex(32).as_bytes(), &parsed));
    let mut as_state = parsed.clone();
    as_state["kind"] = json!("state");
    assert_eq!(sign::verify_detail(key.as_bytes(), &as_state), Err(VerifyError::Mismatch));
}

/// HMAC of `data` computed by `openssl dgst -sha256 -hmac KEY` (KEY is a throwaway test key).
fn openssl_hmac(key: &str, data: &[u8]) -> String {
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl dgst failed: {}", String::from_utf8_lossy(&out.stderr));
    // "SHA2-256(stdin)= <hex>" (3.x) or "(stdin)= <hex>" (1.1): the digest is the last word.
    String::from_utf8(out.stdout).unwrap().split_whitespace().last().unwrap().to_string()
}

#[test]
fn u11_openssl_verifies_signatures_over_canonical_bytes() {
    if !have_tool("openssl", "MAM_REQUIRE_OPENSSL") {
        return;
    }
    let key = rand_hex(32);
    let doc = vectors();
    let mut checked = 0;
    for case in doc["vectors"].as_array().unwrap() {
        let name = field(case, "name");
        if !["event_payload", "state_payload", "dispatch_payload", "keys_non_ascii", "control_chars"].contains(&name) {
            continue;
        }
        let input = &case["input"];
        let bytes = sign::canonical_unsigned(input).unwrap();
        assert_eq!(openssl_hmac(&key, &bytes), sign::sign(key.as_bytes(), input).unwrap(), "{name}");
        checked += 1;
    }
    assert_eq!(checked, 5);
    // The remote auth token is the same primitive over a fixed message.
    let (job, token) = ("5ee3fbcf", rand_hex(16));
    let msg = format!("mam-auth\n{job}\n7\n{token}");
    assert_eq!(openssl_hmac(&key, msg.as_bytes()), sign::derive_remote_auth_token(key.as_bytes(), job, 7, &token));
}
