#!/usr/bin/env python3
"""Load generator for scripts/bench_broker.sh: raw MQTT 3.1.1 over sockets, standard library only.

  bench_broker.py rss PORT PID N    N idle clients (CONNECT, SUBSCRIBE one topic each): the broker's
                                    RSS before, with N connected, and after they left
  bench_broker.py thr PORT QOS M [PID [IDLE]]
                                    one subscriber, one publisher, M messages of 64 bytes at QOS:
                                    throughput and p50/p99 publish-to-delivery latency; with the
                                    broker's PID also its CPU time (user + system) per message;
                                    with IDLE, that many idle clients (one subscription each on a
                                    topic of their own) connected during the run

Every wait has a deadline; a broker that stops answering fails the run.
"""
import os, socket, struct, sys, threading, time

DEADLINE = 60.0


def rlen(n):
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s16(b):
    return struct.pack("!H", len(b)) + b


def connect_pkt(cid, keepalive=600):
    body = s16(b"MQTT") + bytes([4, 2]) + struct.pack("!H", keepalive) + s16(cid.encode())
    return b"\x10" + rlen(len(body)) + body


def subscribe_pkt(pid, topic, qos):
    body = struct.pack("!H", pid) + s16(topic.encode()) + bytes([qos])
    return b"\x82" + rlen(len(body)) + body


def publish_pkt(topic, payload, qos, pid):
    body = s16(topic.encode()) + (struct.pack("!H", pid) if qos else b"") + payload
    return bytes([0x30 | (qos << 1)]) + rlen(len(body)) + body


class Reader:
    def __init__(self, s):
        self.s, self.buf = s, bytearray()

    def packet(self):
        while True:
            if len(self.buf) >= 2:
                n, mul, i = 0, 1, 1
                while i < len(self.buf):
                    b = self.buf[i]
                    n += (b & 0x7F) * mul
                    mul *= 128
                    i += 1
                    if not b & 0x80:
                        break
                else:
                    i = None
                if i is not None and len(self.buf) >= i + n:
                    kind, body = self.buf[0], bytes(self.buf[i:i + n])
                    del self.buf[:i + n]
                    return kind, body
            chunk = self.s.recv(65536)
            if not chunk:
                raise SystemExit("broker closed a connection")
            self.buf += chunk


def open_client(port, cid):
    s = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(connect_pkt(cid))
    r = Reader(s)
    kind, body = r.packet()
    if kind != 0x20 or body[1] != 0:
        raise SystemExit(f"CONNACK refused for {cid}: {body!r}")
    return s, r


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def settled_rss(pid):
    """The RSS once it changes by less than 1% over 200 ms (at most 10 s)."""
    end, last = time.time() + 10, rss_kib(pid)
    while time.time() < end:
        time.sleep(0.2)
        now = rss_kib(pid)
        if abs(now - last) <= max(last // 100, 64):
            return now
        last = now
    return last


def cpu_s(pid):
    """User plus system CPU seconds of process `pid` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_clients(port, n):
    """N connected clients, each subscribed to a topic of its own, SUBACKed."""
    clients = []
    for i in range(n):
        s, r = open_client(port, f"idle-{i}")
        s.sendall(subscribe_pkt(1, f"bench/idle/{i}", 1))
        clients.append((s, r))
    for s, r in clients:
        kind, _ = r.packet()
        if kind != 0x90:
            raise SystemExit("no SUBACK")
    return clients


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(port, pid, n):
    before = settled_rss(pid)
    fds = open_fds(pid)
    clients = idle_clients(port, n)
    held = settled_rss(pid)
    for s, _ in clients:
        s.sendall(b"\xe0\x00")
        s.close()
    # "After" is once the broker closed every connection (its descriptors are back), not merely
    # once its RSS stopped moving: freeing does not move it until the memory is handed back.
    end = time.time() + DEADLINE
    while open_fds(pid) > fds:
        if time.time() > end:
            raise SystemExit(f"the broker still holds {open_fds(pid) - fds} of the connections")
        time.sleep(0.05)
    after = settled_rss(pid)
    print(f"clients={n} rss_before_kib={before} rss_connected_kib={held} rss_after_kib={after}")


def thr(port, qos, m, broker_pid=None, idle=0):
    held = idle_clients(port, idle)
    sub, sr = open_client(port, "bench-sub")
    sub.sendall(subscribe_pkt(1, "bench/t", qos))
    if sr.packet()[0] != 0x90:
        raise SystemExit("no SUBACK")
    lat, done = [], threading.Event()

    def receive():
        got = 0
        while got < m:
            kind, body = sr.packet()
            if kind == 0x62:
                sub.sendall(b"\x70\x02" + body[:2])
            if kind >> 4 != 3:
                continue
            q = (kind >> 1) & 3
            tl = struct.unpack("!H", body[:2])[0]
            off = 2 + tl
            if q:
                pid = body[off:off + 2]
                off += 2
                sub.sendall(b"\x40\x02" + pid if q == 1 else b"\x50\x02" + pid)
            sent = struct.unpack("!d", body[off:off + 8])[0]
            lat.append(time.perf_counter() - sent)
            got += 1
        done.set()

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    pub, pr = open_client(port, "bench-pub")
    cpu0 = cpu_s(broker_pid) if broker_pid else None
    pad = b"x" * 56
    start = time.perf_counter()
    window = 0

    def ack_one():
        nonlocal window
        kind, body = pr.packet()
        if kind == 0x50:
            pub.sendall(b"\x62\x02" + body[:2])
        elif kind in (0x40, 0x70):
            window -= 1

    for i in range(m):
        pid = i % 65535 + 1
        # Keep at most 100 unacknowledged (QoS 2: until PUBCOMP), like a client's in-flight window.
        while qos and window >= 100:
            ack_one()
        pub.sendall(publish_pkt("bench/t", struct.pack("!d", time.perf_counter()) + pad, qos, pid))
        if qos:
            window += 1
    # Finish the flows: a broker that holds a QoS 2 message until PUBREL (mosquitto) delivers it then.
    while qos and window > 0:
        ack_one()
    if not done.wait(DEADLINE):
        raise SystemExit(f"only {len(lat)} of {m} messages delivered within {DEADLINE} s")
    took = time.perf_counter() - start
    cpu = f" cpu_us_per_msg={(cpu_s(broker_pid) - cpu0) / m * 1e6:.2f}" if broker_pid else ""
    lat.sort()
    p50, p99 = lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3
    idle_note = f" idle_clients={idle}" if idle else ""
    print(f"qos={qos}{idle_note} messages={m} msgs_per_s={m / took:.0f} p50_ms={p50:.3f} p99_ms={p99:.3f}{cpu}")
    for s, _ in held:
        s.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "rss":
        rss(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        extra = [int(a) for a in sys.argv[5:7]]
        thr(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *extra)
