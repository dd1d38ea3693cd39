#!/usr/bin/env bash
# `mam status` and `mam jobs` as whole processes over 100 sessions and 10,000 jobs (issue 7), against
# /bin/true in the same hyperfine run. Sessions use the fake pane backend (no server: status must work
# without one); 1% of the jobs are open. Usage: scripts/bench_status.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
cargo build --release --quiet
bin=$PWD/target/release/mam
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ws/.mam" "$tmp/panes"
export MAM_ENV_FILE=/nonexistent MAM_PANE_BACKEND=fake MAM_FAKE_PANES_DIR=$tmp/panes MAM_NO_SUBSCRIBER_DAEMON=1
unset WORKSPACE_ROOT MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR AGENT_SESSIONS_YAML
cd "$tmp/ws"
"$bin" registry register --session w-000 --job-id seed >/dev/null
python3 - "$tmp/ws" <<'PY'
import json, os, sys
ws = sys.argv[1]; jobs = os.path.join(ws, ".mam/jobs")
seed = json.load(open(os.path.join(jobs, "seed.json"))); os.remove(os.path.join(jobs, "seed.json"))
rows = []
for s in range(100):
    name = f"w-{s:03d}"
    rows.append({"name": name, "agent": "claude", "transport": "local", "status": "running", "backend": "fake",
                 "pane": {"id": f"f{s:06d}", "server": "fake", "workspace_id": "w000001", "cwd": ws, "cmd_full": "claude"},
                 "start_command": "claude",
                 "control_plane": {"workspace_root": ws, "agent_sessions_yaml": f"{ws}/.mam/agent_sessions.json",
                                   "mam_jobs_dir": jobs, "delegate_job_logs_dir": f"{ws}/.mam/delegate_job_logs"},
                 "created_at": "2026-11-30T00:00:00.000Z"})
    for j in range(100):
        rec = dict(seed); jid = f"j{s:03d}{j:03d}"
        rec.update(job_id=jid, agent_session=name, status="running" if j == 0 else "completed",
                   topic_prefix=f"mam/jobs/{jid}")
        with open(os.path.join(jobs, jid + ".json"), "w") as f:
            json.dump(rec, f, indent=2); f.write("\n")
json.dump({"version": 1, "herdr_sessions": rows, "orchestrator_uuids": []}, open(f"{ws}/.mam/agent_sessions.json", "w"), indent=2)
PY
echo "sessions: $("$bin" status | grep -c '^w-'), job records: $(ls .mam/jobs | wc -l)"
hyperfine -N --warmup 3 --runs "$runs" --export-json "$tmp/h.json" /bin/true "$bin status" "$bin jobs" >/dev/null 2>&1
python3 - "$tmp/h.json" "$bin" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]; base = r[0]["median"]
for x in r:
    print(f"{x['command'].replace(sys.argv[2], 'mam'):<12} median {x['median']*1e3:8.2f} ms  {x['median']/base:7.1f}x /bin/true")
PY
