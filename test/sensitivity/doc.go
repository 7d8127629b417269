// Package sensitivity holds the CPU version of the sensitivity benchmark
// (issue 33 item 4; the GPU version is bench/gpu/sensitivity.sh): the real
// agent binary, at its defaults but for a 1-s window, on a 4-rank fake job
// (test/faketrainer, no device records) whose rank 1 follows a schedule of
// host stalls (5, 10 and 25 % of the healthy step, healthy phases between)
// and, in a second job, is slow from its first step. The truth is judged by
// the GPU bench's own analysis (bench/gpu/sensitivity.py analyze) against
// the targets: every stall of 5 % or more named on rank 1 within 3
// windows + lateness, and no false alert. Nothing here is imported.
package sensitivity
