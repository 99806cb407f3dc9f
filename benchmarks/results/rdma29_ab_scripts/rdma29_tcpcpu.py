"""CPU per MiB (client + owner) and wall MiB/s of TCP-plane reads/writes vs a raw stream."""
import os, sys, time, statistics, socket, threading, json, resource
import torch  # noqa
from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured
from monarch.rdma import RDMABuffer
import warnings; warnings.simplefilter("ignore")
MIB = 1 << 20
SIZE = int(sys.argv[1]) * MIB; REPS = int(sys.argv[2])
TICK = os.sysconf("SC_CLK_TCK")
def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
def cpu_of(pid):
    f = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(f[11]) + int(f[12])) / TICK
class H(Actor):
    def __init__(self): warnings.simplefilter("ignore"); self.keep = []
    @endpoint
    def make(self, size):
        m = memoryview(bytearray(b"\x5a") * size); b = RDMABuffer(m); self.keep.append((m, b)); return b
    @endpoint
    def pid(self): return os.getpid()
def raw(size, reps):
    server = socket.create_server(("127.0.0.1", 0)); port = server.getsockname()[1]
    data = memoryview(bytearray(b"\x5a") * size)
    def sink():
        conn, _ = server.accept(); into = memoryview(bytearray(size))
        with conn:
            for _ in range(reps + 1):
                got = 0
                while got < size: got += conn.recv_into(into[got:], size - got)
                conn.sendall(b"k")
    t = threading.Thread(target=sink, daemon=True); t.start(); out = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data); s.recv(1)
        c0 = cpu_self()
        for _ in range(reps):
            t0 = time.perf_counter(); s.sendall(data); s.recv(1); out.append(time.perf_counter() - t0)
        c = cpu_self() - c0
    t.join()
    return {"mibps": round(SIZE / MIB / statistics.median(out)), "cpu_ms_per_gib": round(c / (reps * SIZE / MIB) * 1024 * 1000)}
res = {}
for integrity in (True, False):
    with configured(read_peer_buffers=False, rdma_tcp_integrity=integrity):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        h = procs.spawn("h", H)
        buf = h.make.call_one(SIZE).get(); pid = h.pid.call_one().get()
        dst = memoryview(bytearray(b"\x11") * SIZE)
        for op in ("read", "write"):
            f = (lambda: buf.read_into(dst).get()) if op == "read" else (lambda: buf.write_from(dst).get())
            f(); ts = []
            c0, o0 = cpu_self(), cpu_of(pid)
            for _ in range(REPS):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            c, o = cpu_self() - c0, cpu_of(pid) - o0
            gib = REPS * SIZE / MIB / 1024
            res[f"{op}_{'tagged' if integrity else 'untagged'}"] = {"mibps": round(SIZE / MIB / statistics.median(ts)), "cpu_ms_per_gib": round((c + o) / gib * 1000), "client": round(c / gib * 1000), "owner": round(o / gib * 1000)}
        procs.stop().get()
res["raw"] = raw(SIZE, REPS)
print(json.dumps(res))
