#!/usr/bin/env bash
# Builds the end-to-end test's servers into .cache/tools/bin (git-ignored):
#   otelcol  OpenTelemetry Collector v0.165.0 (otlp receiver, batch, otlp /
#            otlphttp / debug exporters, contrib prometheus exporter v0.165.1,
#            contrib loadbalancing exporter v0.148.0: the newest release the
#            module proxy serves), from test/e2e/tools/otelcol; it runs
#            deploy/otelcol.yaml and deploy/otelcol-loadbalancing.yaml
#   jaeger   Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger v1.76.0),
#            from test/e2e/tools/jaeger
# Two modules because Jaeger v1.76.0 pins collector v0.140.0 while the
# collector here is v0.165.0; one module would force one of them onto
# versions it was not built against.
# A tool is rebuilt only when its go.mod, go.sum, sources or the Go version
# changed (stamp file next to the binary). Set SLOWRANK_TOOLS_BIN to build
# elsewhere. Measured on the 2-core dev machine from an empty build cache:
# see test/e2e/README.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${SLOWRANK_TOOLS_BIN:-$root/.cache/tools/bin}
mkdir -p "$bin"

build() {
	local name=$1 dir=$2 pkg=$3
	local hash stamp start
	hash=$( (go env GOVERSION; cat "$dir/go.mod" "$dir/go.sum"; cat "$dir"/*.go 2>/dev/null || true) | sha256sum | cut -c1-32)
	stamp=$bin/.$name.stamp
	if [[ -x $bin/$name && -f $stamp && $(cat "$stamp") == "$hash" ]]; then
		echo "build-tools: $name up to date ($hash)"
		return
	fi
	start=$(date +%s)
	echo "build-tools: building $name ..."
	(cd "$dir" && GOFLAGS=-mod=readonly go build -trimpath -ldflags='-s -w' -o "$bin/$name.tmp" "$pkg")
	mv -f "$bin/$name.tmp" "$bin/$name"
	echo "$hash" >"$stamp"
	echo "build-tools: built $name in $(($(date +%s) - start))s"
}

build otelcol "$root/test/e2e/tools/otelcol" .
build jaeger "$root/test/e2e/tools/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
