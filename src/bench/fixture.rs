//! Registries to benchmark the listings on: `n` job records shaped as `mam registry register`
//! writes them (`NewRecord`), in `<ws>/.mam/jobs`, and a sessions file of 100 rows on the fake
//! pane backend so `mam status` has rows to look up. 1% of the jobs are running, the rest
//! completed; creation times are spread over 30 days in an order unrelated to the ids, so the
//! listings' sort does real work. Written without fsync (a benchmark fixture, removed afterwards).

use std::io;
use std::path::Path;

use serde_json::{json, Value};

use crate::clock;
use crate::registry::record::{NewRecord, Record};
use crate::sys;

/// Sessions in the fixture's sessions file; the jobs are spread over them.
pub const SESSIONS: usize = 100;

/// A small deterministic generator for ids, tokens and times (a fixture needs no secrecy).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn hex(&mut self, chars: usize) -> String {
        let mut s = String::with_capacity(chars + 16);
        while s.len() < chars {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(chars);
        s
    }
}

/// Writes the workspace `ws` (which must exist): `n` records, the sessions file, the fake
/// backend's pane directory `<ws>/panes`. `now_ms` anchors the creation times (the 30 days
/// before it).
pub fn workspace(ws: &Path, n: usize, now_ms: u64) -> io::Result<()> {
    let jobs = ws.join(".mam").join("jobs");
    sys::create_dir_all(&jobs)?;
    sys::create_dir_all(&ws.join("panes"))?;
    let mut mix = Mix(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    let span = 30 * 86_400_000;
    for i in 0..n {
        let id = format!("j{i:07}");
        let created = now_ms - span + mix.next() % span;
        let session = format!("w-{:03}", i % SESSIONS);
        let fields = NewRecord {
            dispatch_token: mix.hex(32),
            auth_token: mix.hex(64),
            agent_session: session,
            broker: json!({"host": "127.0.0.1", "port": 1883, "tls": false, "username": null,
                           "ca_file": null, "topic_root": "mam"}),
            topic_prefix: format!("mam/jobs/{id}"),
            ..NewRecord::local_task(id.clone())
        }
        .fields(created);
        let mut rec = Record::new(fields);
        let ts = clock::format_ts(created + 1_000);
        rec.set("claimed_at", ts.clone());
        rec.set("transition_seq", 2);
        if i % 100 == 0 {
            rec.set("status", "running");
            rec.set("updated_at", clock::format_ts(now_ms));
        } else {
            let done = clock::format_ts(created + 60_000);
            rec.set("status", "completed");
            rec.set("finished_at", done.clone());
            rec.set("updated_at", done);
            rec.set("last_event", "completed");
            rec.set("last_seq", 3);
            rec.set("transition_seq", 3);
        }
        sys::write_file(&jobs.join(format!("{id}.json")), &rec.to_bytes())?;
    }
    let ws_s = ws.display().to_string();
    let rows: Vec<Value> = (0..SESSIONS)
        .map(|s| {
            json!({
                "name": format!("w-{s:03}"), "agent": "claude", "transport": "local", "status": "running",
                "backend": "fake",
                "pane": {"id": format!("f{s:06}"), "server": "fake", "workspace_id": "w000001", "cwd": ws_s,
                         "cmd_full": "claude"},
                "start_command": "claude",
                "control_plane": {"workspace_root": ws_s,
                                  "agent_sessions_yaml": format!("{ws_s}/.mam/agent_sessions.json"),
                                  "mam_jobs_dir": jobs.display().to_string(),
                                  "delegate_job_logs_dir": format!("{ws_s}/.mam/delegate_job_logs")},
                "created_at": clock::format_ts(now_ms),
            })
        })
        .collect();
    let doc = json!({"version": 1, "herdr_sessions": rows, "orchestrator_uuids": []});
    let mut bytes = serde_json::to_vec_pretty(&doc).map_err(io::Error::other)?;
    bytes.push(b'\n');
    sys::write_file(&ws.join(".mam").join("agent_sessions.json"), &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_one_in_a_hundred_runs() {
        let dir = std::env::temp_dir().join(format!("mam-fixture-{}", std::process::id()));
        sys::create_dir_all(&dir).unwrap();
        workspace(&dir, 200, 1_800_000_000_000).unwrap();
        let store = crate::registry::store::Store::new(dir.join(".mam/jobs"), dir.join(".mam/logs"));
        let ids = store.job_ids().unwrap();
        assert_eq!(ids.len(), 200);
        let running = ids.iter().filter(|id| store.read_existing(id).unwrap().status() == "running").count();
        assert_eq!(running, 2);
        let rec = store.read_existing("j0000007").unwrap();
        assert_eq!((rec.str("agent_session"), rec.str("job_id")), (Some("w-007"), Some("j0000007")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
