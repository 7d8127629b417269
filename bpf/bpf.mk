# bpf/bpf.mk - Make fragment for package bpf. Include it from the top-level
# Makefile (`include bpf/bpf.mk`); paths are relative to the repository root.
#
#   make bpf-generate        regenerate slowrank_x86_bpfel.{go,o} from the C sources
#   make bpf-check-generated regenerate and fail if the committed output differs
#   make bpf-test            unprivileged tests (privileged ones skip without root)
#   make bpf-bench           per-call probe cost (root)
#
# The compiler is pinned so the committed object is reproducible byte for
# byte; bpf2go already strips DWARF, maps the source directory to a relative
# path and drops the clang ident.

BPF_CLANG ?= clang-14
BPF_STRIP ?= llvm-strip-14
BPF_GO ?= go

BPF_SOURCES := bpf/slowrank.bpf.c bpf/events.h bpf/gen.go bpf/gen_wire.go
BPF_GENERATED := bpf/slowrank_x86_bpfel.go bpf/slowrank_x86_bpfel.o bpf/wire_gen.go

.PHONY: bpf-generate bpf-check-generated bpf-test bpf-bench

bpf-generate:
	BPF2GO_CC=$(BPF_CLANG) BPF2GO_STRIP=$(BPF_STRIP) $(BPF_GO) generate ./bpf/...

bpf-check-generated: bpf-generate
	git diff --exit-code -- $(BPF_GENERATED)

bpf-test:
	$(BPF_GO) test -race ./bpf/...

bpf-bench:
	$(BPF_GO) test -run '^$$' -bench ProbeCost ./bpf/
