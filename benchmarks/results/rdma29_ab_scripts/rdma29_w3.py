"""Client -> proc (memory plane): write_from / read_into medians at 1, 16, 128 MiB, and memcpy."""
import time, statistics, json, ctypes
import torch  # noqa
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer
import warnings; warnings.simplefilter("ignore")
MIB = 1 << 20
class H(Actor):
    def __init__(self): warnings.simplefilter("ignore"); self.keep = []
    @endpoint
    def make(self, size):
        m = memoryview(bytearray(b"\x5a") * size); b = RDMABuffer(m); self.keep.append((m, b)); return b
p = this_host().spawn_procs(per_host={"procs": 1}).spawn("h", H)
res = {}
for mib, reps in ((1, 200), (16, 30), (128, 8)):
    size = mib * MIB
    buf = p.make.call_one(size).get()
    src = bytearray(b"\x33") * size; dst = bytearray(b"\x44") * size
    for op in ("write", "read", "memcpy"):
        f = {"write": lambda: buf.write_from(src).get(), "read": lambda: buf.read_into(dst).get(),
             "memcpy": lambda: dst.__setitem__(slice(None), src)}[op]
        f(); ts = []
        for _ in range(reps):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        res[f"{op}_{mib}MiB_us"] = round(statistics.median(ts) * 1e6, 1)
    assert dst[:4] == b"\x33" * 4
print(json.dumps(res))
