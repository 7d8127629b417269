# slowrank — build, test and demo. Run as root on Debian 12 (see README.md).
SHELL      := /bin/bash
GO         ?= go
OUT_DIR    ?= bin
CUDA_HOME  ?= /usr/local/cuda
VERSION    ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOFLAGS_BUILD := -trimpath -ldflags "-X main.version=$(VERSION)"
FUZZTIME   ?= 10s
export OUT_DIR CUDA_HOME
# go-nvml declares deprecated NVML calls; its cgo build would warn on each.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all deps build test golangci-lint c-format c-format-check e2e-tools demo-sim unit-test race-test fuzz-test helm-check rules-test bench-selftest lint generate go-generate check-generated demo bench clean help

all: build

help: ## list targets
	@grep -hE '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# Fragments owned by the packages that need native builds.
-include bpf/bpf.mk
-include cupti/cupti.mk
-include test/fakelibs/fakelibs.mk

deps: ## install what test and demo need on Debian 12 (root; apt only for what is missing, then go mod download)
	bash .ci/deps

build: ## build the slowrank binary into bin/
	$(GO) build $(GOFLAGS_BUILD) -o $(OUT_DIR)/slowrank ./cmd/slowrank

# golangci-lint is built from the Go module proxy into .cache/tools (git-
# ignored) once per version and Go release: a binary built by an older Go
# cannot load packages of a newer language version. .golangci.yml says what
# it checks (the import layering among them).
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT_DIR := $(CURDIR)/.cache/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT := $(GOLANGCI_LINT_DIR)/golangci-lint

golangci-lint: ## build the pinned golangci-lint into .cache/tools (cached)
	@want=$$($(GO) env GOVERSION); \
	if [ -x $(GOLANGCI_LINT) ] && [ "$$(cat $(GOLANGCI_LINT_DIR)/.goversion 2>/dev/null)" = "$$want" ]; then exit 0; fi; \
	echo "building golangci-lint $(GOLANGCI_LINT_VERSION) with $$want into $(GOLANGCI_LINT_DIR) ..."; start=$$(date +%s); \
	GOBIN=$(GOLANGCI_LINT_DIR) $(GO) install -trimpath github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && \
	echo "$$want" > $(GOLANGCI_LINT_DIR)/.goversion && echo "built golangci-lint in $$(( $$(date +%s) - start ))s"

# C style: .clang-format at the root (kernel-like, cupti/), bpf/ (100
# columns) and test/fakelibs/ (two-space). Pinned to Debian 12's
# clang-format-14 like BPF_CLANG: other versions format some lines
# differently.
CLANG_FORMAT ?= clang-format-14
C_FORMAT_FILES = $(shell git ls-files 'bpf/*.[ch]' 'bpf/*.cpp' 'cupti/*.[ch]' 'test/fakelibs/*.[ch]' 'test/fakelibs/*.cpp')

c-format-check: ## fail when a C/C++ file of bpf/, cupti/ or test/fakelibs/ is not clang-formatted
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT) not found: apt-get install clang-format-14"; exit 1; }
	@$(CLANG_FORMAT) --dry-run --Werror $(C_FORMAT_FILES) || { echo "C files need formatting: make c-format"; exit 1; }

c-format: ## clang-format the C/C++ files of bpf/, cupti/ and test/fakelibs/ in place
	$(CLANG_FORMAT) -i $(C_FORMAT_FILES)

lint: golangci-lint c-format-check ## golangci-lint (import layering, staticcheck, errorlint, unused, misspell, gofmt), go vet, go mod tidy -diff, clang-format
	$(GOLANGCI_LINT) run ./...
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd deploy/helm/check && $(GO) mod tidy -diff

generate: bpf-generate cupti-generate go-generate ## regenerate committed generated code (bpf2go, cgo -godefs, stringer)

# The packages other than bpf/ and cupti/ (their fragments pin compilers)
# whose go:generate lines need only Go: stringer, as `go run
# golang.org/x/tools/cmd/stringer@VERSION` (no tool dependency in go.mod).
# Found by their lines, so that a new one is regenerated and checked too.
GO_GENERATE_DIRS = $(filter-out bpf cupti,$(patsubst %/,%,$(sort $(dir $(shell git grep -l '^//go:generate' -- '*.go')))))

go-generate: ## regenerate the stringer output of the packages outside bpf/ and cupti/
	$(if $(GO_GENERATE_DIRS),$(GO) generate $(addprefix ./,$(GO_GENERATE_DIRS)))

.PHONY: docs
docs: ## regenerate docs/metrics.md from the metric declarations (otel/export/results.go, selfmetrics/table.go)
	$(GO) generate ./otel/export/

check-generated: generate ## fail when generated code differs from what is committed
	@dirs="bpf cupti $(GO_GENERATE_DIRS)"; if [ -n "$$(git status --porcelain -- $$dirs)" ]; then git status --porcelain -- $$dirs; git diff --stat; \
	  echo "generated files are stale: run make generate and commit"; exit 1; fi

e2e-tools: ## build the OpenTelemetry Collector and Jaeger used by the e2e tests (cached)
	bash test/e2e/build-tools.sh

# The sensitivity tier runs alone after the rest: its job keeps 4 ranks busy
# on a 2-core machine, and run beside the integration tier it slowed both
# (a loop-shape test split steps; a 10 % stall was named a window late).
unit-test: ## go test with the race detector (privileged tests run as root); then the sensitivity tier alone
	SLOWRANK_E2E_REQUIRED=1 $(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/test/sensitivity$$')
	$(GO) test -race -count=1 -timeout 10m ./test/sensitivity/

fuzz-test: ## run every fuzz target for FUZZTIME (test/fuzz/run.sh)
	FUZZTIME=$(FUZZTIME) GO=$(GO) test/fuzz/run.sh

helm-check: ## render the Helm chart with Helm's engine and decode every manifest against the Kubernetes types (own module)
	cd deploy/helm/check && $(GO) vet ./... && $(GO) test -count=1 ./...

rules-test: ## check and unit-test the Prometheus alert rules (promtool, Debian's prometheus package); the chart ships the same file
	promtool check rules deploy/prometheus/slowrank-rules.yaml
	cd deploy/prometheus && promtool test rules slowrank-rules.test.yaml
	cmp deploy/prometheus/slowrank-rules.yaml deploy/helm/slowrank/files/slowrank-rules.yaml || \
	  { echo "deploy/helm/slowrank/files/slowrank-rules.yaml differs: cp deploy/prometheus/slowrank-rules.yaml deploy/helm/slowrank/files/"; exit 1; }

test: deps lint build fakelibs cupti-test cupti-test-tsan cupti-stress cupti-nccl-san e2e-tools unit-test fuzz-test helm-check rules-test bench-selftest ## everything CI runs

bench-selftest: ## the GPU benches' analysis (bench/gpu/analyze.py: statistics, plans, parsers; nccl_plugin.py's dump pairing; sensitivity.py's judge) on synthetic data; standard-library Python
	python3 bench/gpu/analyze.py selftest
	python3 bench/gpu/nccl_plugin.py selftest
	python3 bench/gpu/nccl_arrival.py selftest
	python3 bench/gpu/sensitivity.py selftest

demo: deps build fakelibs ## the agent on a 4-rank fake job with one slow rank (root)
	test/demo/demo.sh

demo-sim: build ## the detector alone on a simulated 8-rank job
	@mkdir -p out
	$(OUT_DIR)/slowrank simulate --ranks 8 --duration 60s --dp-groups 1 \
	  --slow rank=3,phase=compute,from=20s,factor=1.15 \
	  --slow rank=5,phase=host,from=30s,add=15ms --output out/demo-facts.jsonl
	$(OUT_DIR)/slowrank replay --input out/demo-facts.jsonl --output out/demo-verdicts.jsonl --report

bench: ## Go benchmarks of the detector
	$(GO) test -run '^$$' -bench . -benchmem ./detector/

clean:
	rm -rf $(OUT_DIR) out
