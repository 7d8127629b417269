# cupti/cupti.mk - builds and tests the CUPTI injection library.
#
# Include it from the top-level Makefile (`include cupti/cupti.mk`) or run it
# alone from the repository root: `make -f cupti/cupti.mk cupti-test`.
#
#   make cupti           $(OUT_DIR)/libslowrank_cupti.so
#   make cupti-headers   fetch Debian's cuda.h into $(CUPTI_CACHE) when missing
#   make cupti-test      C unit tests (converter, dlopen + InitializeInjection,
#                        the NCCL plugin, its ABI against NCCL's headers)
#   make cupti-test-tsan test_inject against a ThreadSanitizer build of the library
#   make cupti-generate  regenerate cupti/abi_defs.go from slowrank_abi.h and
#                        the stringer output cupti/*_string.go
#   make cupti-clean
#
# Headers: a CUDA toolkit under $(CUDA_HOME) when it has cupti.h (the GPU
# machine: /usr/local/cuda/targets/x86_64-linux/include); otherwise Debian's
# libcupti-dev in /usr/include plus cuda.h extracted from nvidia-cuda-dev into
# $(CUPTI_CACHE) (done by cupti-headers, automatically when needed).

CUPTI_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
CUPTI_ROOT := $(abspath $(CUPTI_DIR)/..)

OUT_DIR ?= bin
CUDA_HOME ?= /usr/local/cuda
CUPTI_CACHE ?= $(CUPTI_ROOT)/.cache/cuda-include
CUPTI_CC ?= $(CC)
CUPTI_OPT ?= -O2 -g
CUPTI_WARN ?= -Wall -Wextra -Wno-deprecated-declarations
CUPTI_EXTRA_CFLAGS ?=
CUPTI_TEST_SAN ?= -fsanitize=address,undefined -fno-omit-frame-pointer
GO ?= go

CUPTI_TOOLKIT_HEADER := $(firstword $(wildcard \
	$(CUDA_HOME)/targets/x86_64-linux/include/cupti.h \
	$(CUDA_HOME)/extras/CUPTI/include/cupti.h \
	$(CUDA_HOME)/include/cupti.h))

ifneq ($(CUPTI_TOOLKIT_HEADER),)
CUPTI_INCLUDES := -I$(CUDA_HOME)/include -I$(CUDA_HOME)/targets/x86_64-linux/include \
	-I$(CUDA_HOME)/extras/CUPTI/include
CUPTI_HEADER_DEPS :=
else
# Debian: /usr/include/cupti.h (libcupti-dev) first, the extracted cuda.h after.
CUPTI_INCLUDES := -idirafter $(CUPTI_CACHE)/usr/include
CUPTI_HEADER_DEPS := $(CUPTI_CACHE)/usr/include/cuda.h
endif

CUPTI_CFLAGS := -std=c11 $(CUPTI_OPT) $(CUPTI_WARN) -fPIC -fvisibility=hidden \
	-I$(CUPTI_DIR) $(CUPTI_INCLUDES) $(CUPTI_EXTRA_CFLAGS)
CUPTI_LIB := $(OUT_DIR)/libslowrank_cupti.so
CUPTI_LIB_SRCS := $(CUPTI_DIR)/slowrank_cupti.c $(CUPTI_DIR)/slowrank_convert.c $(CUPTI_DIR)/slowrank_nccl.c
CUPTI_TEST_HDRS := $(CUPTI_DIR)/test_clock.h
CUPTI_HDRS := $(CUPTI_DIR)/slowrank_abi.h $(CUPTI_DIR)/slowrank_convert.h $(CUPTI_DIR)/slowrank_nccl.h $(CUPTI_DIR)/nccl_profiler.h
CUPTI_TEST_OUT := $(OUT_DIR)/cupti-test
# Every build of the library, shipped or sanitized, is never unmapped: NCCL
# dlcloses its profiler plugin after the last comm while the control thread
# still runs in it, and a test of another link than the shipped one tests
# another program. (relro/now/--no-undefined stay shipped-only: sanitizer
# runtimes resolve symbols late.)
CUPTI_LIB_KEEP := -Wl,-z,nodelete

.PHONY: cupti cupti-headers cupti-test cupti-test-tsan cupti-generate cupti-clean

cupti: $(CUPTI_LIB)

$(CUPTI_LIB): $(CUPTI_LIB_SRCS) $(CUPTI_HDRS) $(CUPTI_HEADER_DEPS)
	@mkdir -p $(OUT_DIR)
	$(CUPTI_CC) $(CUPTI_CFLAGS) -shared -o $@ $(CUPTI_LIB_SRCS) \
		$(CUPTI_LIB_KEEP) -Wl,-z,relro -Wl,-z,now -Wl,--no-undefined -ldl -lpthread

cupti-headers: $(CUPTI_CACHE)/usr/include/cuda.h

$(CUPTI_CACHE)/usr/include/cuda.h:
	$(CUPTI_DIR)/fetch-cuda-headers.sh $(CUPTI_CACHE)

# NCCL's profiler ABI: cupti/nccl_profiler.h against NCCL's own profiler
# headers of the release tags vendored in third_party/nccl (README.md
# there), compared at compile time by cupti/test_nccl_abi.c; part of
# cupti-test. Against any NVIDIA/nccl checkout (another tag, a newer
# release): make cupti-nccl-abi-src NCCL_SRC=path.
CUPTI_NCCL_ABI_TAGS := v2.27.7-1 v2.28.9-1
CUPTI_NCCL_THIRD := $(CUPTI_ROOT)/third_party/nccl
CUPTI_NCCL_ABI_BINS := $(foreach t,$(CUPTI_NCCL_ABI_TAGS),$(CUPTI_TEST_OUT)/nccl-abi/$(t))
CUPTI_NCCL_ABI_CC = $(CUPTI_CC) -std=c11 $(CUPTI_OPT) $(CUPTI_WARN) -Werror -I$(CUPTI_DIR) \
	-I$(CUPTI_DIR)/testdata/nccl_abi
CUPTI_NCCL_ABI_DEPS := $(CUPTI_DIR)/test_nccl_abi.c $(CUPTI_DIR)/nccl_profiler.h $(CUPTI_DIR)/testdata/nccl_abi/os.h \
	$(CUPTI_DIR)/testdata/nccl_abi/cstdint

$(CUPTI_TEST_OUT)/nccl-abi/%: $(CUPTI_NCCL_ABI_DEPS) $(CUPTI_NCCL_THIRD)/%/src/include/plugin/nccl_profiler.h
	@mkdir -p $(dir $@)
	$(CUPTI_NCCL_ABI_CC) -I$(CUPTI_NCCL_THIRD)/$*/src/include -DSR_NCCL_TAG='"$*"' -o $@ $(CUPTI_DIR)/test_nccl_abi.c

.PHONY: cupti-nccl-abi cupti-nccl-abi-src
cupti-nccl-abi: $(CUPTI_NCCL_ABI_BINS)
	for t in $(CUPTI_NCCL_ABI_BINS); do $$t || exit 1; done

cupti-nccl-abi-src: $(CUPTI_NCCL_ABI_DEPS)
	@test -f "$(NCCL_SRC)/src/include/plugin/nccl_profiler.h" || \
		{ echo "usage: make cupti-nccl-abi-src NCCL_SRC=<an NVIDIA/nccl checkout>"; exit 2; }
	@mkdir -p $(CUPTI_TEST_OUT)/nccl-abi
	$(CUPTI_NCCL_ABI_CC) -I$(NCCL_SRC)/src/include \
		-DSR_NCCL_TAG="\"$$(git -C $(NCCL_SRC) describe --tags 2>/dev/null || echo $(NCCL_SRC))\"" \
		-o $(CUPTI_TEST_OUT)/nccl-abi/src $(CUPTI_DIR)/test_nccl_abi.c
	$(CUPTI_TEST_OUT)/nccl-abi/src

$(CUPTI_TEST_OUT)/test_convert: $(CUPTI_DIR)/test_convert.c $(CUPTI_DIR)/slowrank_convert.c $(CUPTI_HDRS) $(CUPTI_HEADER_DEPS)
	@mkdir -p $(CUPTI_TEST_OUT)
	$(CUPTI_CC) $(CUPTI_CFLAGS) $(CUPTI_TEST_SAN) -o $@ $(CUPTI_DIR)/test_convert.c $(CUPTI_DIR)/slowrank_convert.c

$(CUPTI_TEST_OUT)/test_inject: $(CUPTI_DIR)/test_inject.c $(CUPTI_DIR)/slowrank_abi.h $(CUPTI_TEST_HDRS)
	@mkdir -p $(CUPTI_TEST_OUT)
	$(CUPTI_CC) -std=c11 $(CUPTI_OPT) $(CUPTI_WARN) -I$(CUPTI_DIR) -o $@ $(CUPTI_DIR)/test_inject.c -ldl -lpthread

# test_convert rewrites cupti/testdata/converter.batches and the converter
# seeds of the Go fuzz corpus (deterministic: CI may diff them).
cupti-test: $(CUPTI_LIB) $(CUPTI_TEST_OUT)/test_convert $(CUPTI_TEST_OUT)/test_inject $(CUPTI_TEST_OUT)/test_nccl \
		$(CUPTI_NCCL_ABI_BINS)
	for t in $(CUPTI_NCCL_ABI_BINS); do $$t || exit 1; done
	$(CUPTI_TEST_OUT)/test_convert $(CUPTI_DIR)/testdata
	timeout 60 $(CUPTI_TEST_OUT)/test_inject $(CUPTI_LIB)
	timeout 300 $(CUPTI_TEST_OUT)/test_nccl $(CUPTI_LIB)

# The runtime (control thread, seqlock, semaphore) under ThreadSanitizer.
cupti-test-tsan: $(CUPTI_LIB_SRCS) $(CUPTI_HDRS) $(CUPTI_DIR)/test_inject.c $(CUPTI_TEST_HDRS) $(CUPTI_HEADER_DEPS)
	@mkdir -p $(CUPTI_TEST_OUT)/tsan
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan -fsanitize=thread -shared -o $(CUPTI_TEST_OUT)/tsan/libslowrank_cupti.so \
		$(CUPTI_LIB_SRCS) $(CUPTI_LIB_KEEP) -ldl -lpthread
	$(CUPTI_CC) -std=c11 $(CUPTI_OPT) -fsanitize=thread -I$(CUPTI_DIR) -o $(CUPTI_TEST_OUT)/tsan/test_inject \
		$(CUPTI_DIR)/test_inject.c -ldl -lpthread
	TSAN_OPTIONS=halt_on_error=1 timeout 120 $(CUPTI_TEST_OUT)/tsan/test_inject $(CUPTI_TEST_OUT)/tsan/libslowrank_cupti.so

# The life cycle under a random schedule (attach, detach, SIGKILL, restart,
# bad control writes, fork, a Kineto-like second client, cuptiFinalize)
# against the fake libcupti, once under ASan+UBSan and once under TSan, with
# an agent that publishes the other client's callbacks (Handback); then once
# more under ASan with an agent that does not (STRESS_OLD_AGENT=1).
# STRESS_SECONDS per run; STRESS_SEED=N repeats a schedule.
STRESS_SECONDS ?= 8
CUPTI_FAKE_SRC := $(CUPTI_ROOT)/test/fakelibs/cupti.c
CUPTI_STRESS_DEPS := $(CUPTI_LIB_SRCS) $(CUPTI_HDRS) $(CUPTI_TEST_HDRS) $(CUPTI_DIR)/test_stress.c $(CUPTI_FAKE_SRC) \
	$(CUPTI_ROOT)/test/fakelibs/fakecupti.h $(CUPTI_HEADER_DEPS)

define cupti_stress_build
$(CUPTI_TEST_OUT)/$(1)/test_stress: $(CUPTI_STRESS_DEPS) $(CUPTI_DIR)/cupti.mk
	@mkdir -p $(CUPTI_TEST_OUT)/$(1)
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -shared -o $(CUPTI_TEST_OUT)/$(1)/libslowrank_cupti.so \
		$(CUPTI_LIB_SRCS) $(CUPTI_LIB_KEEP) -ldl -lpthread
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -fvisibility=default -shared -o $(CUPTI_TEST_OUT)/$(1)/libcupti.so \
		$(CUPTI_FAKE_SRC) -lpthread
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -o $$@ $(CUPTI_DIR)/test_stress.c -ldl -lpthread
$(CUPTI_TEST_OUT)/$(1)/test_drain: $(CUPTI_TEST_OUT)/$(1)/test_stress $(CUPTI_DIR)/test_drain.c $(CUPTI_TEST_HDRS)
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -o $$@ $(CUPTI_DIR)/test_drain.c -ldl -lpthread
$(CUPTI_TEST_OUT)/$(1)/test_quiet: $(CUPTI_TEST_OUT)/$(1)/test_stress $(CUPTI_DIR)/test_quiet.c $(CUPTI_TEST_HDRS)
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -o $$@ $(CUPTI_DIR)/test_quiet.c -ldl -lpthread
endef
CUPTI_SAN_asan := -fsanitize=address,undefined -fno-omit-frame-pointer
CUPTI_SAN_tsan := -fsanitize=thread
$(eval $(call cupti_stress_build,asan,$$(CUPTI_SAN_asan)))
$(eval $(call cupti_stress_build,tsan,$$(CUPTI_SAN_tsan)))
$(eval $(call cupti_stress_build,plain,))

# The same program and fake libcupti without sanitizers, for the tests that
# put a real agent in front of them (test/reliability).
.PHONY: cupti-stress-plain
cupti-stress-plain: $(CUPTI_TEST_OUT)/plain/test_stress

# The control thread's wake-ups while an agent attached but never decided
# (test_quiet.c), unsanitized: it prints the measured wake-ups a second.
.PHONY: cupti-quiet
cupti-quiet: $(CUPTI_TEST_OUT)/plain/test_quiet
	timeout 60 $(CUPTI_TEST_OUT)/plain/test_quiet $(CUPTI_TEST_OUT)/plain/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/plain/libcupti.so

.PHONY: cupti-stress
cupti-stress: $(CUPTI_TEST_OUT)/asan/test_stress $(CUPTI_TEST_OUT)/tsan/test_stress \
		$(CUPTI_TEST_OUT)/asan/test_drain $(CUPTI_TEST_OUT)/tsan/test_drain \
		$(CUPTI_TEST_OUT)/asan/test_quiet $(CUPTI_TEST_OUT)/tsan/test_quiet
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		timeout 60 $(CUPTI_TEST_OUT)/asan/test_quiet $(CUPTI_TEST_OUT)/asan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/asan/libcupti.so
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		timeout 60 $(CUPTI_TEST_OUT)/tsan/test_quiet $(CUPTI_TEST_OUT)/tsan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/tsan/libcupti.so
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		timeout 60 $(CUPTI_TEST_OUT)/asan/test_drain $(CUPTI_TEST_OUT)/asan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/asan/libcupti.so
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		timeout 60 $(CUPTI_TEST_OUT)/tsan/test_drain $(CUPTI_TEST_OUT)/tsan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/tsan/libcupti.so
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		timeout 120 $(CUPTI_TEST_OUT)/asan/test_stress $(CUPTI_TEST_OUT)/asan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/asan/libcupti.so $(STRESS_SECONDS)
	STRESS_OLD_AGENT=1 ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		timeout 120 $(CUPTI_TEST_OUT)/asan/test_stress $(CUPTI_TEST_OUT)/asan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/asan/libcupti.so $(STRESS_SECONDS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		timeout 180 $(CUPTI_TEST_OUT)/tsan/test_stress $(CUPTI_TEST_OUT)/tsan/libslowrank_cupti.so \
		$(CUPTI_TEST_OUT)/tsan/libcupti.so $(STRESS_SECONDS)

# The Go mirror of slowrank_abi.h and the enums' String() methods: every
# //go:generate line of the package (cgo -godefs, stringer; also part of
# `go generate ./...`). check-generated runs it and fails on a diff.
cupti-generate:
	cd $(CUPTI_DIR) && $(GO) generate ./

cupti-clean:
	rm -rf $(CUPTI_LIB) $(CUPTI_TEST_OUT)

# The NCCL profiler plugin (slowrank_nccl.c) driven by a fake NCCL
# (test/fakelibs/ncclprof.c) as NCCL's profiler.cc drives it, from several
# user threads and a proxy thread: plain (part of cupti-test), then under
# ASan+UBSan and TSan (cupti-nccl-san). Linked -z nodelete like the real
# library (CUPTI_LIB_KEEP).
CUPTI_NCCL_FAKE := $(CUPTI_ROOT)/test/fakelibs/ncclprof.c
CUPTI_NCCL_TEST_DEPS := $(CUPTI_DIR)/test_nccl.c $(CUPTI_NCCL_FAKE) $(CUPTI_ROOT)/test/fakelibs/ncclprof.h $(CUPTI_HDRS) $(CUPTI_TEST_HDRS)

$(CUPTI_TEST_OUT)/test_nccl: $(CUPTI_NCCL_TEST_DEPS)
	@mkdir -p $(CUPTI_TEST_OUT)
	$(CUPTI_CC) -std=c11 $(CUPTI_OPT) $(CUPTI_WARN) -I$(CUPTI_DIR) -o $@ $(CUPTI_DIR)/test_nccl.c $(CUPTI_NCCL_FAKE) -ldl -lpthread

define cupti_nccl_san_build
$(CUPTI_TEST_OUT)/nccl-$(1)/test_nccl: $(CUPTI_LIB_SRCS) $(CUPTI_NCCL_TEST_DEPS) $(CUPTI_HEADER_DEPS) $(CUPTI_DIR)/cupti.mk
	@mkdir -p $(CUPTI_TEST_OUT)/nccl-$(1)
	$(CUPTI_CC) $(CUPTI_CFLAGS) -Wno-tsan $(2) -shared -o $(CUPTI_TEST_OUT)/nccl-$(1)/libslowrank_cupti.so \
		$(CUPTI_LIB_SRCS) $(CUPTI_LIB_KEEP) -ldl -lpthread
	$(CUPTI_CC) -std=c11 $(CUPTI_OPT) $(CUPTI_WARN) $(2) -I$(CUPTI_DIR) -o $$@ $(CUPTI_DIR)/test_nccl.c \
		$(CUPTI_NCCL_FAKE) -ldl -lpthread
endef
$(eval $(call cupti_nccl_san_build,asan,$$(CUPTI_SAN_asan)))
$(eval $(call cupti_nccl_san_build,tsan,$$(CUPTI_SAN_tsan)))

.PHONY: cupti-nccl-test cupti-nccl-san
cupti-nccl-test: $(CUPTI_LIB) $(CUPTI_TEST_OUT)/test_nccl
	timeout 300 $(CUPTI_TEST_OUT)/test_nccl $(CUPTI_LIB)

cupti-nccl-san: $(CUPTI_TEST_OUT)/nccl-asan/test_nccl $(CUPTI_TEST_OUT)/nccl-tsan/test_nccl
	ASAN_OPTIONS=abort_on_error=1:detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		timeout 300 $(CUPTI_TEST_OUT)/nccl-asan/test_nccl $(CUPTI_TEST_OUT)/nccl-asan/libslowrank_cupti.so
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		timeout 600 $(CUPTI_TEST_OUT)/nccl-tsan/test_nccl $(CUPTI_TEST_OUT)/nccl-tsan/libslowrank_cupti.so
