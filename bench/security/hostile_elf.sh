#!/bin/sh
# Agent cost of one hostile library (issue 17): a process selected by its
# environment maps a libnccl.so.2 whose .symtab declares 200 MiB and is a
# hole (0 bytes on disk; SYMTAB_MIB sets the size). Prints the agent's peak RSS and CPU time.
# Usage (root): bench/security/hostile_elf.sh [SLOWRANK_BINARY] [SECONDS]
set -eu
bin=${1:-bin/slowrank}
secs=${2:-30}
mib=${SYMTAB_MIB:-200}
dir=$(mktemp -d /tmp/slowrank-hostile-XXXXXX)
key=SLOWRANK_HOSTILE_$$
trap 'kill $holder 2>/dev/null || true; rm -rf "$dir"' EXIT
python3 - "$dir/libnccl.so.2" "$mib" <<'PY'
import struct, sys
MIB = 1 << 20
symsize = int(sys.argv[2]) * MIB // 24 * 24
strtab = b"\0ncclAllReduce\0"
hdr = bytearray(0x1000)
hdr[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
shoff = 0x200
struct.pack_into("<HHIQQQIHHHHHH", hdr, 16, 3, 62, 1, 0, 64, shoff, 0, 64, 56, 1, 64, 3, 0)
struct.pack_into("<IIQQQQQ", hdr, 64, 1, 5, 0, 0, 0, 0x1000, 0x1000)  # PT_LOAD r-x
secs = [(0, 0, 0, 0, 0), (2, MIB, symsize, 2, 24), (3, 0x800, len(strtab), 0, 0)]
for i, (typ, off, size, link, ent) in enumerate(secs):
    struct.pack_into("<IIQQQQIIQQ", hdr, shoff + 64 * i, 0, typ, 0, 0, off, size, link, 0, 0, ent)
hdr[0x800:0x800 + len(strtab)] = strtab
with open(sys.argv[1], "wb") as f:
    f.write(hdr)
    f.truncate(MIB + symsize)
PY
echo "hostile file: $(stat -c '%s bytes, %b blocks' "$dir/libnccl.so.2")"
env "$key=1" RANK=0 python3 -c 'import mmap,sys,time; f=open(sys.argv[1],"rb"); m=mmap.mmap(f.fileno(),4096,prot=mmap.PROT_READ); time.sleep(3600)' "$dir/libnccl.so.2" &
holder=$!
/usr/bin/time -f "agent: peak RSS %M kB, CPU %U s user %S s sys, wall %e s" \
	"$bin" agent --env-key "$key" --status-socket "$dir/status.sock" --otel off --duration "${secs}s" \
	2>&1 | grep -E "training process|attach|agent:" | cut -c1-300
