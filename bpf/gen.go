package bpf

// The BPF object and the Go mirrors of the structs in events.h are generated
// by bpf2go and committed. Regenerate with `make bpf-generate` (bpf/bpf.mk),
// which pins the compiler; CI regenerates and fails on `git diff --exit-code`.
//
//go:generate go tool bpf2go -target amd64 -cflags "-Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -type sr_event_hdr -type sr_coll_event -type sr_comm_init_event -type sr_sync_event -type sr_group_event -type sr_torch_event -type sr_batch_event -type sr_cupti_call_event -type sr_event_type -type sr_probe_id -type sr_layout -type sr_counter slowrank slowrank.bpf.c -- -I.
//
// The ProbeID and Layout constants and the record structs the decoder reads at come
// from bpf2go's copies of events.h; the second step writes them to
// wire_gen.go, which builds on every architecture (the bpf2go file is x86
// only).
//
//go:generate go run gen_wire.go
