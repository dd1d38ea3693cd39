#!/usr/bin/env bash
# The attacks of issue 12 item 4 against one `mam broker` (docs/PERFORMANCE.md, docs/SECURITY.md):
#   1. an anonymous CONNECT (its CONNACK code: 0 accepted, 5 refused);
#   2. a retained flood: N retained messages of 1 MiB on distinct topics (the broker's VmRSS before
#      and after; with the workspace's credentials when the broker generated them);
#   3. a connection flood: C TCP connections held open (the broker's descriptors, whether it is still
#      up), then whether an authorised client gets a CONNACK 0 once the flood has ended.
# Usage: scripts/attack_broker.sh [extra mam broker flags]   (env: MAM_BIN, RETAINED=800, CONNS=5400)
set -euo pipefail
MAM_BIN=$(realpath "${MAM_BIN:-target/release/mam}")
RETAINED=${RETAINED:-800} CONNS=${CONNS:-5400}
work=$(mktemp -d)
mkdir -p "$work/ws"
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$work/ws" && exec "$MAM_BIN" broker --port 0 "$@" >"$work/out" 2>"$work/err") &
pid=$!
for _ in $(seq 100); do grep -q 'listening on' "$work/out" 2>/dev/null && break; sleep 0.05; done
port=$(sed -n 's/^mam broker listening on .*:\([0-9]*\)$/\1/p' "$work/out")
[ -n "$port" ] || { echo "ERROR: broker did not start: $(cat "$work/err")" >&2; exit 1; }
ulimit -n "$(ulimit -Hn)"
python3 - "$port" "$pid" "$work/ws/.mam/broker.cred" "$RETAINED" "$CONNS" <<'PY'
import os, socket, struct, sys, time
port, pid, cred, nret, nconn = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
user = pw = None
if os.path.exists(cred):
    for l in open(cred):
        if l.startswith('-u '): user = l[3:].strip()
        if l.startswith('-P '): pw = l[3:].strip()
def rl(n):
    out = b''
    while True:
        b = n % 128; n //= 128
        out += bytes([b | (0x80 if n else 0)])
        if not n: return out
def s16(b): return struct.pack('>H', len(b)) + b
def connect(cid, u=None, p=None):
    flags = 0x02 | (0x80 if u else 0) | (0x40 if p else 0)
    body = s16(b'MQTT') + bytes([4, flags]) + struct.pack('>H', 60) + s16(cid.encode())
    if u: body += s16(u.encode())
    if p: body += s16(p.encode())
    return b'\x10' + rl(len(body)) + body
def rss():
    for l in open(f'/proc/{pid}/status'):
        if l.startswith('VmRSS:'): return int(l.split()[1]) // 1024
def fds(): return len(os.listdir(f'/proc/{pid}/fd'))
def alive():
    try: os.kill(pid, 0); return True
    except OSError: return False
def session(cid, u=None, p=None, timeout=5):
    s = socket.create_connection(('127.0.0.1', port), timeout=timeout)
    s.sendall(connect(cid, u, p))
    ack = s.recv(4)
    return s, (ack[3] if len(ack) == 4 else None)
def recvn(s, n):
    b = b''
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: raise EOFError
        b += c
    return b
s, code = session('anon')
print(f'anonymous CONNACK: {code}')
s.close()
s, code = session('flooder', user, pw)
assert code == 0, f'flooder refused: {code}'
print(f'RSS before retained flood: {rss()} MiB')
payload = b'x' * (1024 * 1024 - 100)
t0 = time.time()
for i in range(nret):
    topic = f'flood/{i:04d}'.encode()
    body = s16(topic) + struct.pack('>H', (i % 65535) + 1) + payload
    s.sendall(b'\x33' + rl(len(body)) + body)
    recvn(s, 4)  # PUBACK
print(f'RSS after {nret} retained 1 MiB messages: {rss()} MiB ({time.time() - t0:.1f} s)')
s.close()
print(f'descriptors before connection flood: {fds()}')
held, failed = [], 0
for i in range(nconn):
    try: held.append(socket.create_connection(('127.0.0.1', port), timeout=2))
    except OSError: failed += 1
time.sleep(1)
print(f'connection flood: {len(held)} connected ({failed} failed); broker descriptors {fds()}; alive {alive()}')
for c in held: c.close()
ok = None
deadline = time.time() + 15
while time.time() < deadline:
    try:
        c, ok = session('after', user, pw, timeout=2); c.close()
        if ok == 0: break
    except OSError: pass
    time.sleep(0.2)
print(f'authorised client after the flood: CONNACK {ok}; broker alive {alive()}; RSS {rss()} MiB')
PY
echo "broker log lines: $(wc -l <"$work/err")"; head -n 3 "$work/err"
