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

# ---- Release (deploy/release/README.md) ----------------------------------
# The release's version is the chart's appVersion (the image tag the chart
# defaults to). Outputs go to $(RELEASE_DIR); tools and the pinned .deb
# files to .cache/release. Nothing takes the commit or the clock: the same
# tree and toolchain build the same files, and the image the same digest.
RELEASE_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/helm/slowrank/Chart.yaml)
RELEASE_REPO    := ghcr.io/slowrank/slowrank
RELEASE_DIR     ?= out/release
RELEASE_CACHE   := $(CURDIR)/.cache/release
RELEASE_TOOL    := $(RELEASE_CACHE)/release
RELEASE_VALUES  := deploy/helm/slowrank/values.yaml
RELEASE_MANIFESTS = $(shell grep -l '$(RELEASE_REPO)' deploy/kubernetes/*.yaml)
RELEASE_GOFLAGS := -trimpath -buildvcs=false -ldflags "-X main.version=$(RELEASE_VERSION)"
# The library: Debian's CUPTI headers always (a CUDA toolkit's would make
# another file), and no build paths in its debug information.
RELEASE_CUPTI   := CUDA_HOME=$(RELEASE_CACHE)/no-cuda-toolkit CUPTI_EXTRA_CFLAGS=-ffile-prefix-map=$(CURDIR)=.
export SOURCE_DATE_EPOCH ?= 0

.PHONY: release release-image release-check release-pin

$(RELEASE_TOOL): deploy/release/go.mod deploy/release/go.sum $(wildcard deploy/release/*.go)
	@mkdir -p $(RELEASE_CACHE)
	cd deploy/release && $(GO) build -trimpath -o $(RELEASE_TOOL) .

release: $(RELEASE_TOOL) ## build the release into out/release: binaries, injection library, chart, OCI image, SHA256SUMS
	@test -n "$(RELEASE_VERSION)" || { echo "no appVersion in deploy/helm/slowrank/Chart.yaml"; exit 1; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)/build
	CGO_ENABLED=1 GOOS=linux GOARCH=amd64 $(GO) build $(RELEASE_GOFLAGS) -o $(RELEASE_DIR)/slowrank-linux-amd64 ./cmd/slowrank
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(RELEASE_GOFLAGS) -o $(RELEASE_DIR)/slowrank-linux-arm64 ./cmd/slowrank
	$(MAKE) --no-print-directory cupti OUT_DIR=$(RELEASE_DIR)/build $(RELEASE_CUPTI)
	cp $(RELEASE_DIR)/build/libslowrank_cupti.so $(RELEASE_DIR)/libslowrank_cupti-linux-amd64.so
	$(RELEASE_TOOL) chart -chart deploy/helm/slowrank -o $(RELEASE_DIR) -version $(RELEASE_VERSION)
	$(MAKE) --no-print-directory release-image
	rm -rf $(RELEASE_DIR)/build
	cd $(RELEASE_DIR) && sha256sum slowrank-linux-amd64 slowrank-linux-arm64 libslowrank_cupti-linux-amd64.so \
	  slowrank-$(RELEASE_VERSION).tgz > SHA256SUMS && echo "$$(cat image.digest)  image (OCI layout image/)" >> SHA256SUMS
	@cat $(RELEASE_DIR)/SHA256SUMS

# The image from the release's amd64 binary and library (out/release/image,
# an OCI layout; its digest in out/release/image.digest).
release-image: $(RELEASE_TOOL)
	$(RELEASE_TOOL) image -o $(RELEASE_DIR)/image -version $(RELEASE_VERSION) \
	  -binary $(RELEASE_DIR)/slowrank-linux-amd64 -library $(RELEASE_DIR)/libslowrank_cupti-linux-amd64.so \
	  $$(deploy/release/fetch-debs.sh deploy/release/debs.lock $(RELEASE_CACHE)/debs | sed 's/^/-deb /') > $(RELEASE_DIR)/image.digest
	@echo "image $(RELEASE_REPO):$(RELEASE_VERSION)@$$(cat $(RELEASE_DIR)/image.digest)"

release-pin: release ## write the image digest of `make release` into the chart's values and the manifests
	$(RELEASE_TOOL) pin -values $(RELEASE_VALUES) $(addprefix -manifest ,$(RELEASE_MANIFESTS)) \
	  -repo $(RELEASE_REPO) -tag $(RELEASE_VERSION) -digest $$(cat $(RELEASE_DIR)/image.digest)

# Checks, in order: the tool's own tests; the release builds (helm lint
# --strict and helm package inside); the image's config and files, and
# `slowrank --version` and the init container's copy run in a chroot of its
# file system (root); the image and the chart built again from inputs with
# other file times give the same bytes; the chart and the manifests pin one
# digest, and at a release tag (v$(RELEASE_VERSION) on HEAD) the digest of
# this tree's image.
release-check: ## build the release and verify it (helm lint, image config, slowrank --version in the image, reproducible, pinned digest)
	cd deploy/release && $(GO) vet ./... && $(GO) mod tidy -diff && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory release
	$(RELEASE_TOOL) verify -layout $(RELEASE_DIR)/image -version $(RELEASE_VERSION) \
	  -binary $(RELEASE_DIR)/slowrank-linux-amd64 -library $(RELEASE_DIR)/libslowrank_cupti-linux-amd64.so
	rm -rf $(RELEASE_DIR)/again && mkdir -p $(RELEASE_DIR)/again
	cp -p $(RELEASE_DIR)/slowrank-linux-amd64 $(RELEASE_DIR)/libslowrank_cupti-linux-amd64.so $(RELEASE_DIR)/again/
	touch -d @1700000000 $(RELEASE_DIR)/again/* && chmod 0700 $(RELEASE_DIR)/again/*
	$(MAKE) --no-print-directory release-image RELEASE_DIR=$(RELEASE_DIR)/again
	$(RELEASE_TOOL) chart -chart deploy/helm/slowrank -o $(RELEASE_DIR)/again -version $(RELEASE_VERSION) >/dev/null
	cmp $(RELEASE_DIR)/image.digest $(RELEASE_DIR)/again/image.digest
	cmp $(RELEASE_DIR)/slowrank-$(RELEASE_VERSION).tgz $(RELEASE_DIR)/again/slowrank-$(RELEASE_VERSION).tgz
	diff -r $(RELEASE_DIR)/image $(RELEASE_DIR)/again/image
	rm -rf $(RELEASE_DIR)/again
	@echo "reproducible: image $$(cat $(RELEASE_DIR)/image.digest) and chart built twice, same bytes"
	$(RELEASE_TOOL) pin -check -values $(RELEASE_VALUES) $(addprefix -manifest ,$(RELEASE_MANIFESTS)) \
	  -repo $(RELEASE_REPO) -tag $(RELEASE_VERSION)
	@pinned=$$($(RELEASE_TOOL) pinned -values $(RELEASE_VALUES)); built=$$(cat $(RELEASE_DIR)/image.digest); \
	if [ "$$pinned" = "$$built" ]; then echo "the chart and the manifests pin this tree's image $$built"; \
	elif [ "$$(git describe --exact-match --tags HEAD 2>/dev/null)" = "v$(RELEASE_VERSION)" ]; then \
	  echo "release v$(RELEASE_VERSION): the chart pins $$pinned, this tree builds $$built: make release-pin"; exit 1; \
	else echo "note: the chart pins $$pinned (the last make release-pin); this tree builds $$built. A release tag requires them equal."; fi
