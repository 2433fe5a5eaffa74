# The two commands a new user needs:
#   make demo   build everything, start plimsolld (wasm provider) on loopback, run a snippet
#   make test   the whole test suite (what .ci/run calls)
# And for developers:
#   make audit  fmt check, clippy with warnings denied, then the tests
#   make bench  the benchmarks recorded in docs/benchmarks.md

CARGO_TARGET_DIR ?= $(CURDIR)/target
export CARGO_TARGET_DIR
CARGO ?= cargo
GUEST_WASM := $(CARGO_TARGET_DIR)/wasm32-wasip2/guest/plimsoll_guest_js.wasm
PLIMSOLLD := $(CARGO_TARGET_DIR)/release/plimsolld
export PLIMSOLLD_BIN := $(PLIMSOLLD)
export PLIMSOLL_GUEST_JS_WASM := $(GUEST_WASM)

.PHONY: setup guest build demo test test-rust test-compat audit bench clean

setup:
	@scripts/setup.sh

# The guest component first: the host embeds it (host/build.rs).
guest: setup
	$(CARGO) build -p plimsoll-guest-js --target wasm32-wasip2 --profile guest

build: guest
	$(CARGO) build --release -p plimsoll-host -p plimsoll-tests

demo: build
	@scripts/demo.sh examples/hello.js

test: build
	$(CARGO) test --release -p plimsoll-host -p plimsoll-tests
	.venv/bin/python -m pytest -q tests/compat

audit: guest
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release -p plimsoll-host -p plimsoll-tests --all-targets -- -D warnings
	$(CARGO) clippy -p plimsoll-guest-js --target wasm32-wasip2 --profile guest -- -D warnings
	$(MAKE) test

bench: build
	$(CARGO_TARGET_DIR)/release/plimsoll-bench

clean:
	$(CARGO) clean
