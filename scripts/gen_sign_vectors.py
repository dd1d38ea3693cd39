#!/usr/bin/env python3
"""Generate tests/vectors/canonical.json: canonical-JSON and HMAC-SHA256 vectors for src/sign.rs.

The oracle is CORE 6.2's definition, computed here by Python itself (standard library only):
  canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
  sig       = hmac.new(key, canonical(obj minus top-level "sig"), hashlib.sha256).hexdigest()
and CORE 9.2's remote auth_token:
  hex(HMAC-SHA256(secret, "mam-auth\\n<job_id>\\n<attempt>\\n<dispatch_token>"))

Usage:
  python3 scripts/gen_sign_vectors.py           # (re)write tests/vectors/canonical.json
  python3 scripts/gen_sign_vectors.py --check   # exit 1 if the file differs from what this produces

The inputs are written in their insertion order (deliberately unsorted), so a reader that keeps key
order (serde_json with preserve_order) hands the serializer unsorted objects. The output file is ASCII.
"""

import hashlib
import hmac
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "vectors", "canonical.json")

KEY = "3f1c0ad5e2b94786a1d0c5f3e8b27a6490d1c2b3a4f5e6d7c8b9a0f1e2d3c4b5"  # a fake 64-hex auth_token
LONG_KEY = "k" * 100  # longer than the SHA-256 block: HMAC hashes it first


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sig(key, obj):
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k != "sig"}
    return hmac.new(key.encode("utf-8"), canonical(obj).encode("ascii"), hashlib.sha256).hexdigest()


def auth_token(secret, job_id, attempt, dispatch_token):
    msg = "mam-auth\n%s\n%d\n%s" % (job_id, attempt, dispatch_token)
    return hmac.new(secret.encode("utf-8"), msg.encode("utf-8"), hashlib.sha256).hexdigest()


EVENT = {
    "v": 1,
    "kind": "event",
    "job_id": "5ee3fbcf",
    "attempt": 2,
    "dispatch_token": "0123456789abcdef0123456789abcdef",
    "agent_session": "worker-01",
    "event": "progress",
    "seq": 17,
    "ts": "2026-09-13T01:02:03.456Z",
    "heartbeat": True,
    "message": "step 3/5: caf\u00e9 \u2014 \"quoted\" \\ path/to/file\n\tdone \U0001f600",
    "data": {"rc": 0, "files": ["src/a.rs", "src/\u00e9.rs"], "nested": {"z": None, "a": False}},
    "sig": "0" * 64,
}

STATE = {
    "v": 1,
    "kind": "state",
    "job_id": "5ee3fbcf",
    "attempt": 2,
    "dispatch_token": "0123456789abcdef0123456789abcdef",
    "status": "running",
    "last_event": "progress",
    "seq": 17,
    "ts": "2026-09-13T01:02:03.457Z",
    "sig": "f" * 64,
}

DISPATCH = {
    "v": 1,
    "kind": "dispatch",
    "job_id": "job.remote-7",
    "attempt": 3,
    "dispatch_token": "fedcba9876543210fedcba9876543210",
    "agent_session": "remote:gpu-box",
    "type": "task",
    "iteration": 0,
    "brief": "# Brief\n\nFix the bug in `src/x.rs`.\r\nUse \u201csmart quotes\u201d and \u2028line sep.\n",
    "heartbeat_sec": 30,
    "heartbeat_misses": 3,
    "ack_timeout_sec": 120,
    "idle_timeout_sec": 600,
    "timeout_sec": 0,
    "issued_at": "2026-09-13T01:00:00.000Z",
    "parent_job_id": None,
    "orchestrator_uuid": "6f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b",
}

# (name, input, key). Every input is integer-only so the oracle and mam agree it is valid.
CASES = [
    ("e_acute", "caf\u00e9", KEY),
    ("line_separator_u2028", "a\u2028b\u2029c", KEY),
    ("emoji_astral_surrogate_pair", "smile \U0001f600 and \U0010ffff", KEY),
    ("quote_and_backslash", "say \"hi\" \\ bye \\\"", KEY),
    ("newline_and_tab", "line1\nline2\tcol\r\n", KEY),
    ("backspace_formfeed", "\b\f", KEY),
    ("control_chars", "\u0000\u0001\u001f\u007f\u0080\u009f", KEY),
    ("slash_not_escaped", "a/b//c </script>", KEY),
    ("printable_ascii", "".join(chr(c) for c in range(0x20, 0x7F)), KEY),
    ("bmp_edges", "\u00ff\u0100\u07ff\u0800\ud7ff\ue000\ufeff\uffff", KEY),
    ("nested_objects_and_arrays", {"b": [1, [2, [3, {"y": 1, "x": [{}]}]]], "a": {"d": {"c": []}}}, KEY),
    ("keys_need_sort", {"zeta": 1, "alpha": 2, "Beta": 3, "_u": 4, "10": 5, "9": 6, "": 7}, KEY),
    ("keys_prefixes", {"abc": 1, "ab": 2, "a": 3, "abcd": 4, "a\u0000": 5, "a ": 6}, KEY),
    ("keys_non_ascii", {"\U0001f600": 1, "\uffff": 2, "\u00e9": 3, "e": 4, "\u2028": 5, "\u00ff": 6, "z": 7}, KEY),
    ("keys_escaped", {"tab\t": 1, "quote\"": 2, "back\\": 3, "slash/": 4, "nl\n": 5}, KEY),
    ("empty_object", {}, KEY),
    ("empty_array", [], KEY),
    ("empty_string", "", KEY),
    ("big_integers", [18446744073709551615, 9223372036854775808, 9223372036854775807,
                      -9223372036854775808, 0, -1, 1], KEY),
    ("literals", {"t": True, "f": False, "n": None, "list": [True, False, None]}, KEY),
    ("event_payload", EVENT, KEY),
    ("state_payload", STATE, KEY),
    ("dispatch_payload", DISPATCH, "dispatch secret \u00e9"),
    ("long_key", {"kind": "event", "seq": 1}, LONG_KEY),
    ("empty_key", {"kind": "event", "seq": 1}, ""),
    ("nested_sig_is_signed", {"sig": "a" * 64, "data": {"sig": "inner"}}, KEY),
]

# JSON texts that mam must refuse to canonicalise (Python would print the float; CORE 6.2 forbids it).
REJECT = ["1.5", "1.0", "-0.0", "1e3", "{\"a\":{\"b\":[1,2.5]}}", "[0.1]", "{\"seq\":17,\"ratio\":0.5}"]

AUTH = [
    ("s3cret", "5ee3fbcf", 1, "0123456789abcdef0123456789abcdef"),
    ("dispatch secret \u00e9", "job.remote-7", 3, "fedcba9876543210fedcba9876543210"),
    ("x" * 100, "a", 18446744073709551615, "00000000000000000000000000000000"),
]


def build():
    vectors = []
    for name, obj, key in CASES:
        vectors.append({
            "name": name,
            "key": key,
            "input": obj,
            "canonical": canonical({k: v for k, v in obj.items() if k != "sig"} if isinstance(obj, dict) else obj),
            "canonical_full": canonical(obj),
            "sig": sig(key, obj),
        })
    doc = {
        "about": "Generated by scripts/gen_sign_vectors.py from Python's json.dumps(sort_keys=True, "
                 "separators=(',', ':'), ensure_ascii=True) and hmac/hashlib. Do not edit by hand. "
                 "canonical excludes a top-level sig (the signed bytes); canonical_full is the whole input; "
                 "key is the UTF-8 HMAC key.",
        "python": sys.version.split()[0],
        "vectors": vectors,
        "reject": REJECT,
        "auth_tokens": [
            {"secret": s, "job_id": j, "attempt": a, "dispatch_token": t, "token": auth_token(s, j, a, t)}
            for s, j, a, t in AUTH
        ],
    }
    return json.dumps(doc, indent=1, ensure_ascii=True) + "\n"


def main():
    text = build()
    if sys.argv[1:] == ["--check"]:
        with open(OUT, encoding="ascii") as f:
            old = f.read()
        # The Python version line may differ between machines; everything else must match.
        strip = lambda t: "\n".join(l for l in t.splitlines() if not l.startswith(' "python":'))
        if strip(old) != strip(text):
            print("tests/vectors/canonical.json differs from the generator output", file=sys.stderr)
            return 1
        print("tests/vectors/canonical.json matches")
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(OUT, "w", encoding="ascii") as f:
        f.write(text)
    print("wrote " + os.path.relpath(OUT, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
