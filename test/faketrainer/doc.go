// Package faketrainer holds the tests of the fake training job used by
// slowrank's end-to-end tests: faketrainer.c (a multi-rank synchronous
// data-parallel trainer with exact ground truth) running on the fake
// libnccl.so.2, libcudart.so.12 and libcuda.so.1 of test/fakelibs, or with
// --backend gloo on its fake libtorch_cpu.so.
//
// Nothing here is imported by other packages. The tests are unprivileged:
// they build the C and C++ sources with test/fakelibs/fakelibs.mk (gcc,
// g++ and make are required; the tests skip with a reason without them)
// into a temporary directory, run the trainer and check its JSONL truth
// file. They need no GPU and no eBPF.
package faketrainer
