#!/bin/sh
# Agent cost of one hostile library (issue 17): a process selected by its
# environment maps a libnccl.so.2 whose .symtab declares SYMTAB_MIB (200)
# MiB. By default the table is a hole (0 bytes on disk: refused at once);
# DENSE=1 writes it out with random symbols into a STRTAB_MIB (32) MiB
# .strtab, a table the reader accepts and must read in full.
# Prints the agent's peak RSS and CPU time, and how long the agent's main
# goroutine kept a status request (GET /status asks it for its control state) waiting
# meanwhile: the slowest of requests sent every 50 ms.
# Usage (root): bench/security/hostile_elf.sh [SLOWRANK_BINARY] [SECONDS]
set -eu
bin=${1:-bin/slowrank}
secs=${2:-30}
mib=${SYMTAB_MIB:-200}
dense=${DENSE:-0}
strmib=${STRTAB_MIB:-32}
dir=$(mktemp -d /tmp/slowrank-hostile-XXXXXX)
key=SLOWRANK_HOSTILE_$$
holder=
trap 'kill $holder 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 - "$dir/libnccl.so.2" "$mib" "$dense" "$strmib" <<'PY'
import os, random, struct, sys
MIB = 1 << 20
symsize = int(sys.argv[2]) * MIB // 24 * 24
dense = sys.argv[3] == "1"
strsize = int(sys.argv[4]) * MIB if dense else 16
stroff = 0x800 if not dense else MIB + symsize
hdr = bytearray(0x1000)
hdr[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
shoff = 0x200
struct.pack_into("<HHIQQQIHHHHHH", hdr, 16, 3, 62, 1, 0, 64, shoff, 0, 64, 56, 1, 64, 3, 0)
struct.pack_into("<IIQQQQQ", hdr, 64, 1, 5, 0, 0, 0, 0x1000, 0x1000)  # PT_LOAD r-x
secs = [(0, 0, 0, 0, 0), (2, MIB, symsize, 2, 24), (3, stroff, strsize, 0, 0)]
for i, (typ, off, size, link, ent) in enumerate(secs):
    struct.pack_into("<IIQQQQIIQQ", hdr, shoff + 64 * i, 0, typ, 0, 0, off, size, link, 0, 0, ent)
with open(sys.argv[1], "wb") as f:
    f.write(hdr)
    if not dense:
        f.seek(0x800)
        f.write(b"\0ncclAllReduce\0")
        f.truncate(MIB + symsize)
        sys.exit(0)
    f.seek(MIB)
    rnd = random.Random(17)
    chunk = 1 << 16  # symbols per write
    for done in range(0, symsize // 24, chunk):
        n = min(chunk, symsize // 24 - done)
        names = [rnd.randrange(strsize) for _ in range(n)]
        f.write(b"".join(struct.pack("<IBBHQQ", o, 0x12, 0, 1, 0x1000, 16) for o in names))
    f.seek(stroff)
    for _ in range(strsize // MIB):  # names of ~16 bytes, NUL-separated
        b = bytearray(os.urandom(MIB))
        for j in range(0, MIB, 16):
            b[j] = 0
        f.write(b)
PY
echo "hostile file: $(stat -c '%s bytes, %b blocks' "$dir/libnccl.so.2")"
/usr/bin/time -f "agent: peak RSS %M kB, CPU %U s user %S s sys, wall %e s" -o "$dir/time" \
	"$bin" agent --env-key "$key" --status-socket "$dir/status.sock" --otel off --duration "${secs}s" \
	>"$dir/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do [ -S "$dir/status.sock" ] && break; sleep 0.1; done
(
	# The main goroutine's responsiveness: GET /status waits for its
	# control state (at most 1 s, then answers without it).
	worst=0
	end=$(($(date +%s) + secs - 3))
	while [ "$(date +%s)" -lt "$end" ]; do
		t=$(curl -s -o /dev/null -m 60 -w '%{time_total}' --unix-socket "$dir/status.sock" http://agent/status || echo 0)
		worst=$(python3 -c "print(max($worst, $t))")
		sleep 0.05
	done
	echo "status requests: slowest answer ${worst} s"
) &
poller=$!
sleep 1 # the process appears while the agent runs
env "$key=1" RANK=0 python3 -c 'import mmap,sys,time; f=open(sys.argv[1],"rb"); m=mmap.mmap(f.fileno(),4096,prot=mmap.PROT_READ); time.sleep(3600)' "$dir/libnccl.so.2" &
holder=$!
wait $poller
wait $agent || true
grep -E "training process|attach" "$dir/agent.log" | cut -c1-300
cat "$dir/time"
