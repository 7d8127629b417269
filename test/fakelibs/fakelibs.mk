# test/fakelibs/fakelibs.mk — fake NCCL/CUDA libraries and the fake trainer.
#
# Standalone, from the repository root:
#   make -f test/fakelibs/fakelibs.mk fakelibs            # -> bin/fakelibs/
#   make -f test/fakelibs/fakelibs.mk fakelibs OUT_DIR=/tmp/x
# Or `include test/fakelibs/fakelibs.mk` from another Makefile: the fragment
# keeps that Makefile's default goal and prefixes all its variables.
#
# Output ($(OUT_DIR)/fakelibs): libcuda.so.1, libcudart.so.12, libnccl.so.2
# (real sonames; unversioned .so symlinks), libtorch_cpu.so (C++, the gloo
# process group under torch's mangled names), faketrainer (linked against
# the first three, RUNPATH $ORIGIN; dlopens libtorch_cpu.so for --backend
# gloo), faketrainer-dlopen (loads libnccl.so.2 late) and
# libnccl-profiler-foreign.so (another NCCL profiler plugin, for the
# fallback tests). libnccl.so.2 links ncclprof.c: it loads and drives an NCCL
# profiler plugin (NCCL_PROFILER_PLUGIN) as NCCL >= 2.23 does.
#
# fakelibs-probe adds, in $(OUT_DIR)/fakelibs/probe, what bpf/'s probe tests
# need besides the libraries: a fake libslowrank_cupti.so (the injection
# library's emit ABI; bss/ holds the variant with its semaphore in .bss) and
# probechild, which drives the libraries in echo mode (SLOWRANK_FAKE_ECHO).
# A subdirectory, so that libnccl's bare dlopen of a profiler plugin (it
# searches its $$ORIGIN) can never pick up the fake injection library.

FAKELIBS_SAVED_GOAL := $(.DEFAULT_GOAL)
FAKELIBS_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
FAKETRAINER_DIR := $(patsubst %/,%,$(dir $(FAKELIBS_DIR)))/faketrainer

OUT_DIR ?= bin
FAKELIBS_OUT := $(OUT_DIR)/fakelibs
FAKELIBS_CC ?= gcc
FAKELIBS_CXX ?= g++
FAKELIBS_CUDART_MAJOR ?= 12
FAKELIBS_WERROR ?= -Werror
FAKELIBS_CFLAGS ?= -std=c11 -D_GNU_SOURCE -O2 -g -fno-omit-frame-pointer \
	-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 $(FAKELIBS_WERROR)
FAKELIBS_CXXFLAGS ?= -std=c++17 -D_GNU_SOURCE -O2 -g -fno-omit-frame-pointer \
	-Wall -Wextra -Wshadow -Wformat=2 $(FAKELIBS_WERROR)
FAKELIBS_INC := -I$(FAKELIBS_DIR)/include -I$(FAKELIBS_DIR)
# -fno-ipa-icf: functions with identical bodies stay separate, as in the
# real libraries (an ICF thunk would make one call hit two probes).
FAKELIBS_LIBFLAGS := -shared -fPIC -fno-ipa-icf -fvisibility=hidden -Wl,-z,defs -Wl,--enable-new-dtags -Wl,-rpath,'$$ORIGIN'

FAKELIBS_CUDA := $(FAKELIBS_OUT)/libcuda.so.1
FAKELIBS_CUDART := $(FAKELIBS_OUT)/libcudart.so.$(FAKELIBS_CUDART_MAJOR)
FAKELIBS_NCCL := $(FAKELIBS_OUT)/libnccl.so.2
FAKELIBS_TORCH := $(FAKELIBS_OUT)/libtorch_cpu.so
FAKELIBS_TRAINER := $(FAKELIBS_OUT)/faketrainer
FAKELIBS_TRAINER_DL := $(FAKELIBS_OUT)/faketrainer-dlopen
FAKELIBS_FOREIGN_PROF := $(FAKELIBS_OUT)/libnccl-profiler-foreign.so
FAKELIBS_PROBE := $(FAKELIBS_OUT)/probe
FAKELIBS_HDRS := $(wildcard $(FAKELIBS_DIR)/include/*.h) $(FAKELIBS_DIR)/fakegpu.h $(FAKELIBS_DIR)/ncclprof.h $(lastword $(MAKEFILE_LIST))

.PHONY: fakelibs fakelibs-probe fakelibs-clean

fakelibs: $(FAKELIBS_CUDA) $(FAKELIBS_CUDART) $(FAKELIBS_NCCL) $(FAKELIBS_TORCH) $(FAKELIBS_TRAINER) $(FAKELIBS_TRAINER_DL) $(FAKELIBS_FOREIGN_PROF) \
	$(FAKELIBS_OUT)/libcuda.so $(FAKELIBS_OUT)/libcudart.so $(FAKELIBS_OUT)/libnccl.so

$(FAKELIBS_OUT):
	mkdir -p $@

$(FAKELIBS_CUDA): $(FAKELIBS_DIR)/fakegpu.c $(FAKELIBS_DIR)/echo.c $(FAKELIBS_DIR)/cuda.c $(FAKELIBS_HDRS) | $(FAKELIBS_OUT)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) $(FAKELIBS_LIBFLAGS) -Wl,-soname,libcuda.so.1 \
		-o $@ $(FAKELIBS_DIR)/fakegpu.c $(FAKELIBS_DIR)/echo.c $(FAKELIBS_DIR)/cuda.c -lpthread

# NVIDIA versions every libcudart symbol with the soname ("cudaMalloc@@libcudart.so.12").
$(FAKELIBS_OUT)/libcudart.map: $(lastword $(MAKEFILE_LIST)) | $(FAKELIBS_OUT)
	printf 'libcudart.so.%s {\n  global: cuda*;\n  local: *;\n};\n' $(FAKELIBS_CUDART_MAJOR) > $@

$(FAKELIBS_CUDART): $(FAKELIBS_DIR)/cudart.c $(FAKELIBS_HDRS) $(FAKELIBS_OUT)/libcudart.map $(FAKELIBS_CUDA)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) $(FAKELIBS_LIBFLAGS) \
		-Wl,-soname,libcudart.so.$(FAKELIBS_CUDART_MAJOR) -Wl,--version-script=$(FAKELIBS_OUT)/libcudart.map \
		-o $@ $(FAKELIBS_DIR)/cudart.c -L$(FAKELIBS_OUT) -l:libcuda.so.1

$(FAKELIBS_NCCL): $(FAKELIBS_DIR)/nccl.c $(FAKELIBS_DIR)/ncclprof.c $(FAKELIBS_HDRS) $(FAKELIBS_CUDA)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) $(FAKELIBS_LIBFLAGS) -Wl,-soname,libnccl.so.2 \
		-o $@ $(FAKELIBS_DIR)/nccl.c $(FAKELIBS_DIR)/ncclprof.c -L$(FAKELIBS_OUT) -l:libcuda.so.1 -ldl -lpthread

# Somebody else's profiler plugin: binds the slot, records nothing.
$(FAKELIBS_FOREIGN_PROF): $(FAKELIBS_DIR)/foreignprof.c $(lastword $(MAKEFILE_LIST)) | $(FAKELIBS_OUT)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_LIBFLAGS) -o $@ $(FAKELIBS_DIR)/foreignprof.c

# torch ships libtorch_cpu.so unversioned; it reaches the simulated GPU
# through libcuda.so.1's slowrank_fake_* and looks cudaStreamSynchronize up
# at run time (real libtorch_cpu does not link the CUDA runtime either).
$(FAKELIBS_TORCH): $(FAKELIBS_DIR)/torch.cpp $(FAKELIBS_HDRS) $(FAKELIBS_CUDA)
	$(FAKELIBS_CXX) $(FAKELIBS_CXXFLAGS) $(FAKELIBS_INC) $(FAKELIBS_LIBFLAGS) -Wl,-soname,libtorch_cpu.so \
		-o $@ $(FAKELIBS_DIR)/torch.cpp -L$(FAKELIBS_OUT) -l:libcuda.so.1 -ldl

$(FAKELIBS_OUT)/libcuda.so: $(FAKELIBS_CUDA)
	ln -sf libcuda.so.1 $@
$(FAKELIBS_OUT)/libcudart.so: $(FAKELIBS_CUDART)
	ln -sf libcudart.so.$(FAKELIBS_CUDART_MAJOR) $@
$(FAKELIBS_OUT)/libnccl.so: $(FAKELIBS_NCCL)
	ln -sf libnccl.so.2 $@

$(FAKELIBS_TRAINER): $(FAKETRAINER_DIR)/faketrainer.c $(FAKELIBS_HDRS) $(FAKELIBS_CUDA) $(FAKELIBS_CUDART) $(FAKELIBS_NCCL)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) -DFT_LINKED_NCCL=1 -Wl,--no-as-needed \
		-Wl,--enable-new-dtags -Wl,-rpath,'$$ORIGIN' -o $@ $(FAKETRAINER_DIR)/faketrainer.c \
		-L$(FAKELIBS_OUT) -l:libnccl.so.2 -l:libcudart.so.$(FAKELIBS_CUDART_MAJOR) -l:libcuda.so.1 -ldl -lpthread -lm

$(FAKELIBS_TRAINER_DL): $(FAKETRAINER_DIR)/faketrainer.c $(FAKELIBS_HDRS) $(FAKELIBS_CUDA) $(FAKELIBS_CUDART) $(FAKELIBS_NCCL)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) -DFT_LINKED_NCCL=0 -Wl,--no-as-needed \
		-Wl,--enable-new-dtags -Wl,-rpath,'$$ORIGIN' -o $@ $(FAKETRAINER_DIR)/faketrainer.c \
		-L$(FAKELIBS_OUT) -l:libcudart.so.$(FAKELIBS_CUDART_MAJOR) -l:libcuda.so.1 -ldl -lpthread -lm

fakelibs-probe: fakelibs $(FAKELIBS_PROBE)/libslowrank_cupti.so $(FAKELIBS_PROBE)/bss/libslowrank_cupti.so \
	$(FAKELIBS_PROBE)/probechild

$(FAKELIBS_PROBE)/libslowrank_cupti.so: $(FAKELIBS_DIR)/slowrank_cupti.c $(lastword $(MAKEFILE_LIST))
	mkdir -p $(@D)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_LIBFLAGS) -o $@ $(FAKELIBS_DIR)/slowrank_cupti.c

$(FAKELIBS_PROBE)/bss/libslowrank_cupti.so: $(FAKELIBS_DIR)/slowrank_cupti.c $(lastword $(MAKEFILE_LIST))
	mkdir -p $(@D)
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_LIBFLAGS) -DSEMAPHORE_IN_BSS -o $@ $(FAKELIBS_DIR)/slowrank_cupti.c

# RUNPATH: the injection library next to it, the others one level up (an
# LD_LIBRARY_PATH, as the .bss test sets, wins over both).
$(FAKELIBS_PROBE)/probechild: $(FAKELIBS_DIR)/probechild.c $(FAKELIBS_HDRS) $(FAKELIBS_CUDA) $(FAKELIBS_CUDART) \
		$(FAKELIBS_NCCL) $(FAKELIBS_TORCH) $(FAKELIBS_PROBE)/libslowrank_cupti.so
	$(FAKELIBS_CC) $(FAKELIBS_CFLAGS) $(FAKELIBS_INC) -Wl,--no-as-needed -Wl,--enable-new-dtags \
		-Wl,-rpath,'$$ORIGIN:$$ORIGIN/..' -o $@ $(FAKELIBS_DIR)/probechild.c -L$(FAKELIBS_PROBE) -L$(FAKELIBS_OUT) \
		-l:libnccl.so.2 -l:libcudart.so.$(FAKELIBS_CUDART_MAJOR) -l:libcuda.so.1 -l:libslowrank_cupti.so \
		-l:libtorch_cpu.so

fakelibs-clean:
	rm -rf $(FAKELIBS_OUT)

ifneq ($(FAKELIBS_SAVED_GOAL),)
.DEFAULT_GOAL := $(FAKELIBS_SAVED_GOAL)
endif
