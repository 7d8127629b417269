#!/usr/bin/env bash
# cupti_smoke.sh - GPU validation of libslowrank_cupti.so (no agent needed).
#
# Run from the repository root on the GPU machine (CUDA 13, torch):
#   bash bench/gpu/cupti_smoke.sh [SECONDS_PER_PHASE]
# Output (logs, batch dumps, summary.json) goes to $OUT or out/cupti_smoke.
#
#   build   gcc against $CUDA_HOME/targets/x86_64-linux/include (or wherever
#           cupti.h is: extras/CUPTI/include, the nvidia-cuda-cupti wheel)
#   base    the training loop without the injection library
#   idle    with CUDA_INJECTION64_PATH and no agent: InitializeInjection runs
#           (status line) and collection stays off (exit counters all 0)
#   duty    SLOWRANK_CUPTI_FORCE_ATTACH=1, 300 ms of every 1 s, batches dumped
#           and checked: ABI, record kinds, classes, names, transitions, and
#           that kernel timestamps are CLOCK_MONOTONIC (inside the run)
#   always  forced attach, always on: kernels per step, drops
# Exits non-zero when a check fails. Step times are printed for information
# only (one process per phase: not a paired A/B).
set -uo pipefail

SECS=${1:-15}
ROOT=$(pwd)
OUTDIR=${OUT:-$ROOT/out/cupti_smoke}
mkdir -p "$OUTDIR"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PYTHON:-python3}
LIB=$OUTDIR/libslowrank_cupti.so
fail=0
note() { printf '\n=== %s\n' "$*"; }

note "build"
incs=()
for d in "$CUDA_HOME/targets/x86_64-linux/include" "$CUDA_HOME/extras/CUPTI/include" "$CUDA_HOME/include"; do
	[ -d "$d" ] && incs+=("-I$d")
done
if ! ls "$CUDA_HOME"/targets/x86_64-linux/include/cupti.h "$CUDA_HOME"/extras/CUPTI/include/cupti.h "$CUDA_HOME"/include/cupti.h >/dev/null 2>&1; then
	# cupti.h from the pip wheel (nvidia-cuda-cupti / nvidia cu13 layout).
	whl=$($PY - <<'EOF' 2>/dev/null
import glob, os, site
for sp in site.getsitepackages():
    for p in glob.glob(os.path.join(sp, "nvidia", "*", "include", "cupti.h")):
        print(os.path.dirname(p)); raise SystemExit
EOF
)
	[ -n "$whl" ] && incs+=("-I$whl")
fi
echo "include dirs: ${incs[*]}"
grep -h "define CUPTI_API_VERSION" "${incs[@]/#-I/}"/cupti_version.h 2>/dev/null | head -1
gcc -std=c11 -O2 -g -Wall -Wextra -Wno-deprecated-declarations -fPIC -fvisibility=hidden \
	-Icupti "${incs[@]}" -shared -o "$LIB" cupti/slowrank_cupti.c cupti/slowrank_convert.c \
	-Wl,-z,nodelete -Wl,-z,relro -Wl,-z,now -Wl,--no-undefined -ldl -lpthread 2>&1 | tee "$OUTDIR/build.log"
if [ ! -s "$LIB" ]; then
	echo "FAIL: build (if CUpti_ActivityKernel4 is missing from this CUPTI, add -DSLOWRANK_KERNEL_RECORD=CUpti_ActivityKernel9)"
	exit 1
fi
nm -D --defined-only "$LIB" | grep -E "InitializeInjection|slowrank_cupti_" || true
readelf -W -S "$LIB" | grep -E "\.probes" || true

cat >"$OUTDIR/loop.py" <<'EOF'
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

secs = float(sys.argv[1]); tag = sys.argv[2]
dev = torch.device("cuda", 0)
torch.manual_seed(0)
dist.init_process_group("nccl", init_method="file://" + os.environ["SMOKE_STORE"], rank=0, world_size=1,
                        device_id=dev)

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__(); s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(s, x):
        b, t, d = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, s.h, d // s.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.o(a.transpose(1, 2).reshape(b, t, d))
        return x + s.mlp(s.ln2(x))

d, layers, seq, batch = 1024, 6, 512, 8
model = nn.Sequential(*[Block(d, 16) for _ in range(layers)]).to(dev, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
host = torch.randn(batch, seq, d, dtype=torch.bfloat16).pin_memory()
t0 = time.monotonic_ns()
times, step = [], 0
while True:
    s0 = time.perf_counter()
    x = host.to(dev, non_blocking=True)
    loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    opt.step()
    torch.cuda.synchronize()
    times.append((time.perf_counter() - s0) * 1e3)
    step += 1
    if (time.monotonic_ns() - t0) / 1e9 > secs:
        break
t1 = time.monotonic_ns()
times = sorted(times[5:]) or times
print(json.dumps({"phase": tag, "steps": step, "median_step_ms": times[len(times) // 2],
                  "mono_start_ns": t0, "mono_end_ns": t1}), flush=True)
dist.destroy_process_group()
EOF

cat >"$OUTDIR/check_dump.py" <<'EOF'
# Decodes a SLOWRANK_CUPTI_DUMP file ([u32 len][batch]...) and checks it.
import collections, json, struct, sys
path, run_json = sys.argv[1], sys.argv[2]
run = json.loads(open(run_json).read().strip().splitlines()[-1])
data = open(path, "rb").read()
HDR = struct.Struct("<IHHIIQQQIHHqII")
CLASSES = ["other", "communication", "attention", "gemm", "moe", "copy"]
errors, kinds, classes, names, seqs = [], collections.Counter(), collections.Counter(), {}, []
trans, clocks, kern, stats = [], set(), [], None
off = 0
while off < len(data):
    (n,) = struct.unpack_from("<I", data, off); b = data[off + 4: off + 4 + n]; off += 4 + n
    (magic, ver, flags, pid, count, seq, cdrop, ldrop, total, hsz, clk, coff, cbr, gen) = HDR.unpack_from(b)
    if magic != 0x42435253 or ver != 1 or total != n or hsz != 64 or n > 16384:
        errors.append(f"bad header {magic:#x} v{ver} len {total}/{n}"); continue
    seqs.append(seq); clocks.add((clk, coff, cbr))
    p = 64
    for _ in range(count):
        kind, size = struct.unpack_from("<HH", b, p); r = b[p: p + size]; p += size
        kinds[kind] += 1
        if kind == 1:
            cls, = struct.unpack_from("<B", r, 4)
            s, e = struct.unpack_from("<QQ", r, 8)
            nid, = struct.unpack_from("<I", r, 64)
            classes[CLASSES[cls] if cls < 6 else cls] += 1
            kern.append((s, e, nid))
        elif kind == 4:
            ln, cls, fl, nid, full = struct.unpack_from("<HBBII", r, 4)
            names[nid] = (r[16:16 + ln].decode("utf-8", "replace"), CLASSES[cls] if cls < 6 else cls)
        elif kind == 6:
            on, reason, mode, ts = struct.unpack_from("<BBHQ", r, 4)
            trans.append((ts, on, reason))
        elif kind == 5:
            nc, = struct.unpack_from("<H", r, 4)
            stats = struct.unpack_from("<%dQ" % nc, r, 8)
    if p != total:
        errors.append(f"batch {seq}: records end at {p}, length {total}")
if not seqs:
    errors.append("no batches")
elif seqs != list(range(seqs[0], seqs[0] + len(seqs))):
    errors.append("sequence numbers not consecutive")
missing = sum(1 for _, _, nid in kern if nid and nid not in names)
inside = sum(1 for s, e, _ in kern if run["mono_start_ns"] - 5e9 <= s <= e <= run["mono_end_ns"] + 5e9)
ons = [t for t in trans if t[1] == 1]
print(f"batches {len(seqs)} records {dict(kinds)} clock(source,offset,bracket) {sorted(clocks)}")
print(f"kernel classes {dict(classes)}; names {len(names)}; kernels with unknown name {missing}")
print(f"kernels with CLOCK_MONOTONIC timestamps inside the run: {inside}/{len(kern)}")
print(f"transitions: {len(ons)} on, {len(trans) - len(ons)} off")
if stats:
    keys = ["records_seen", "kernels", "memcpys", "memsets", "unknown_kinds", "bad_records", "names",
            "names_overflow", "buffers_requested", "buffers_refused", "buffers_completed", "batches",
            "batch_bytes", "flushes", "enables", "attaches", "cupti_errors", "on_ns", "discarded_detached"]
    print("last stats:", dict(zip(keys, stats)))
for nid, (nm, cls) in list(names.items())[:12]:
    print(f"  name {nid:4d} {cls:13s} {nm[:110]}")
if not kern: errors.append("no kernel records")
if kern and inside < 0.99 * len(kern): errors.append("kernel timestamps are not CLOCK_MONOTONIC")
if missing: errors.append(f"{missing} kernels reference undefined names")
if len(ons) < 2 and sys.argv[3:] == ["duty"]: errors.append("duty cycle did not toggle")
for e in errors: print("FAIL:", e)
sys.exit(1 if errors else 0)
EOF

phase() { # name, extra env...
	local name=$1; shift
	rm -f "$OUTDIR/$name.store"
	env SMOKE_STORE="$OUTDIR/$name.store" "$@" $PY "$OUTDIR/loop.py" "$SECS" "$name" \
		>"$OUTDIR/$name.out" 2>"$OUTDIR/$name.err"
	local rc=$?
	cat "$OUTDIR/$name.out"
	grep "slowrank-cupti" "$OUTDIR/$name.err" || true
	if [ $rc -ne 0 ]; then echo "FAIL: phase $name exited $rc"; tail -20 "$OUTDIR/$name.err"; fail=1; fi
}

note "base (no injection)"
phase base

note "idle (injected, no agent)"
phase idle CUDA_INJECTION64_PATH="$LIB" SLOWRANK_CUPTI_DEBUG=1
grep -q "slowrank-cupti: pid [0-9]*: ready" "$OUTDIR/idle.err" || { echo "FAIL: no ready line (InitializeInjection did not run or libcupti not found)"; fail=1; }
if grep -q "exit: state 1 attaches 0 enables 0 on_ms 0 batches 0 records 0" "$OUTDIR/idle.err"; then
	echo "ok: collection stayed off without an agent"
else
	echo "FAIL: idle exit counters not all zero"; fail=1
fi

note "duty (forced attach, 300 ms of every 1 s)"
rm -f "$OUTDIR/duty.batches"
phase duty CUDA_INJECTION64_PATH="$LIB" SLOWRANK_CUPTI_DEBUG=1 SLOWRANK_CUPTI_FORCE_ATTACH=1 \
	SLOWRANK_CUPTI_MODE=time:300:1000 SLOWRANK_CUPTI_DUMP="$OUTDIR/duty.batches"
$PY "$OUTDIR/check_dump.py" "$OUTDIR/duty.batches" "$OUTDIR/duty.out" duty || fail=1

note "always (forced attach, always on)"
rm -f "$OUTDIR/always.batches"
phase always CUDA_INJECTION64_PATH="$LIB" SLOWRANK_CUPTI_DEBUG=1 SLOWRANK_CUPTI_FORCE_ATTACH=1 \
	SLOWRANK_CUPTI_MODE=always SLOWRANK_CUPTI_DUMP="$OUTDIR/always.batches"
$PY "$OUTDIR/check_dump.py" "$OUTDIR/always.batches" "$OUTDIR/always.out" always || fail=1

note "summary"
cat "$OUTDIR"/{base,idle,duty,always}.out 2>/dev/null
if [ $fail -eq 0 ]; then echo "cupti_smoke: PASS"; else echo "cupti_smoke: FAIL"; fi
exit $fail
