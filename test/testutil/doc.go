// Package testutil owns the helpers that slowrank's privileged test
// packages (test/integration, test/reliability, test/e2e and
// test/multihost) share: locating the repository and the e2e tool
// binaries, skipping without root or kernel support, building the agent
// binary and the fake libraries and trainer (test/fakelibs), running helper
// processes and keeping their output, reading the fake trainer's ground
// truth, and free ports and the monotonic clock.
//
// It is imported only by those tests. Helpers that can fail take a
// testing.TB and fail or skip it; all are safe for concurrent use by
// parallel tests. Nothing here needs root itself: building needs go, make
// and a C compiler, and ToolsBin finds what `make e2e-tools` builds.
package testutil
