# nextn — build, test and benchmark. `make`, `make test`, `make bench`, `make fuzz`.
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?=
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla -Wformat=2 -Werror
DEPS    := jansson libpcre2-8 libutf8proc libmicrohttpd zlib
# no contraction of a·b + c into one fused step: the kernels' bit-for-bit rules (kernels.h) are
# written for separately rounded products, and compilers differ in their default
BASE    := -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -fno-strict-aliasing -ffp-contract=off -Iinclude -Isrc \
           $(shell pkg-config --cflags $(DEPS)) $(SAN) $(CFLAGS)
LIBS    := $(shell pkg-config --libs $(DEPS)) -lm -lpthread
TESTLIB := $(shell pkg-config --libs cmocka)

# Per-ISA kernel files get their own flags; everything else stays baseline x86-64 and the
# dispatcher picks at run time. AMX is never emitted (it faults in some VMs).
AVX2_FLAGS   := -mavx2 -mfma -mf16c
# Only what dispatch.c checks for: the compiler may use any enabled extension anywhere in the file.
AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                -mno-amx-tile -mno-amx-int8 -mno-amx-bf16

# NEON extensions for the integer tables, each only in its own file (dispatch.c checks them)
NEONDOT_FLAGS := -march=armv8.2-a+dotprod
NEONI8MM_FLAGS := -march=armv8.2-a+dotprod+i8mm

# Each architecture's kernel files are built only for it: the x86 files for x86-64, the NEON
# files for AArch64 (Linux or macOS); elsewhere the scalar reference alone.
ARCH := $(shell $(CC) -dumpmachine)
X86_KERNELS  := src/kernels/avx%
NEON_KERNELS := src/kernels/neon%
ifneq (,$(filter x86_64% amd64% i386% i486% i586% i686%,$(ARCH)))
ARCH_OUT := $(NEON_KERNELS)
else ifneq (,$(filter aarch64% arm64%,$(ARCH)))
ARCH_OUT := $(X86_KERNELS)
else
ARCH_OUT := $(X86_KERNELS) $(NEON_KERNELS)
endif

# Several processes over MPI (--split; src/dist/dist.c) when Open MPI's development files are
# installed (MPI=0 leaves it out); otherwise src/dist/dist_none.c, whose --split says it needs them.
MPI ?= $(shell pkg-config --exists ompi-c && echo 1 || echo 0)
ifeq ($(MPI),1)
DIST_OUT   := src/dist/dist_none.c
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c)
LIBS       += $(shell pkg-config --libs ompi-c)
else
DIST_OUT   := src/dist/dist.c
endif

LIB_SRC  := $(filter-out $(ARCH_OUT) $(DIST_OUT),$(sort $(wildcard src/*/*.c)))
# GCC 12's AArch64 loop vectorizer stops with an internal error on some test loops
# (vect_transform_reduction); the tests do not need it.
TEST_OPT := $(if $(filter aarch64%,$(ARCH)),-fno-tree-vectorize)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_SRC  := $(sort $(wildcard tools/cli/*.c))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(sort $(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test unit e2e asan bench fuzz clean test-arm64
all: $(BUILD)/nextn $(TEST_BIN) $(BENCH_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE) -MMD -MP -c $< -o $@

$(BUILD)/src/kernels/avx2.o $(BUILD)/src/kernels/avx2_int8.o $(BUILD)/src/kernels/%_avx2.o: BASE += $(AVX2_FLAGS)
$(BUILD)/src/kernels/avx512.o $(BUILD)/src/kernels/avx512_t0.o $(BUILD)/src/kernels/%_avx512.o: BASE += $(AVX512_FLAGS)
$(BUILD)/src/kernels/avx2_vnni.o: BASE += $(AVX2_FLAGS) -mavxvnni
$(BUILD)/src/kernels/avx512_vnni.o $(BUILD)/src/kernels/avx512_vnni_t0.o: BASE += $(AVX512_FLAGS) -mavx512vnni
$(BUILD)/src/kernels/avx512_vbmi.o $(BUILD)/src/kernels/avx512_vbmi_t0.o: BASE += $(AVX512_FLAGS) -mavx512vnni -mavx512vbmi -mgfni
$(BUILD)/src/dist/dist.o: BASE += $(MPI_CFLAGS)
$(BUILD)/src/kernels/neon_dot.o: BASE += $(NEONDOT_FLAGS)
$(BUILD)/src/kernels/neon_i8mm.o: BASE += $(NEONI8MM_FLAGS)

$(BUILD)/libnextn.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The chat page (web/) goes into the nextn program as a C table written by tools/web_embed.c,
# which runs on the build machine (HOSTCC) whatever CC targets.
HOSTCC    ?= cc
WEB_FILES := $(sort $(wildcard web/*.html web/*.css web/*.js web/*.svg))
$(BUILD)/web_embed: tools/web_embed.c
	@mkdir -p $(dir $@)
	$(HOSTCC) -std=c11 -O2 $(WARN) -o $@ $<

$(BUILD)/gen/web_files.c: $(WEB_FILES) $(BUILD)/web_embed
	@mkdir -p $(dir $@)
	$(BUILD)/web_embed $@ $(WEB_FILES)

$(BUILD)/gen/web_files.o: $(BUILD)/gen/web_files.c
	$(CC) $(BASE) -c $< -o $@

$(BUILD)/nextn: $(CLI_OBJ) $(BUILD)/gen/web_files.o $(BUILD)/libnextn.a
	$(CC) $(BASE) -o $@ $(CLI_OBJ) $(BUILD)/gen/web_files.o $(BUILD)/libnextn.a $(LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libnextn.a
	@mkdir -p $(dir $@)
	$(CC) $(BASE) $(TEST_OPT) -DNX_SOURCE_ROOT='"$(CURDIR)"' -MMD -MP -o $@ $< $(BUILD)/libnextn.a $(LIBS) $(TESTLIB)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libnextn.a
	@mkdir -p $(dir $@)
	$(CC) $(BASE) -o $@ $< $(BUILD)/libnextn.a $(LIBS)

# The README's test command. Unit tests (cmocka, TAP) and end-to-end scripts run under prove;
# then the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: all
	CMOCKA_MESSAGE_OUTPUT=TAP NEXTN=$(BUILD)/nextn prove -f --exec '' $(TEST_BIN) $(sort $(wildcard tests/e2e/*.t))
	$(MAKE) --no-print-directory asan
ifneq (,$(filter x86_64%linux-gnu,$(ARCH)))
	$(MAKE) --no-print-directory test-arm64
endif

# The AArch64 build, cross-compiled (Debian's gcc-aarch64-linux-gnu and arm64 -dev packages,
# scripts/setup.sh) into build-arm64/ and run under qemu-aarch64 on two CPU models: "max" (dotprod
# and i8mm: every NEON table) and cortex-a53 (plain NEON). The kernel tests against the reference
# on both, the other unit tests on "max", then end-to-end parity, greedy MTP == AR and bench
# (scripts/arm64_e2e.py). Part of `make test` on x86-64 Linux; an AArch64 machine runs `make test`
# natively instead.
ARM64_ENV := PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
test-arm64:
	$(ARM64_ENV) $(MAKE) --no-print-directory BUILD=build-arm64 CC=aarch64-linux-gnu-gcc \
	    build-arm64/nextn $(TEST_SRC:tests/unit/%.c=build-arm64/tests/%)
	bash scripts/test-arm64.sh

unit: all
	CMOCKA_MESSAGE_OUTPUT=TAP prove -f --exec '' $(TEST_BIN)

asan:
	$(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" unit

bench: all
	bash bench/run.sh

# Coverage-guided fuzzing of every untrusted-input parser (clang's libFuzzer).
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 20
fuzz:
	bash fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf build build-asan build-fuzz build-arm64

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
