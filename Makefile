# The two commands a new user needs:
#   make demo   build everything, start plimsolld (wasm provider) on loopback, run a snippet
#   make test   the whole test suite (what .ci/run calls)
# And for developers:
#   make audit  fmt check, clippy with warnings denied, then the tests
#   make bench  the benchmarks recorded in docs/benchmarks.md
#   make soak   many mixed runs against real daemons, leaks measured

CARGO_TARGET_DIR ?= $(CURDIR)/target
export CARGO_TARGET_DIR
CARGO ?= cargo
WASM_OUT := $(CARGO_TARGET_DIR)/wasm32-wasip2/guest
GUEST_WASM := $(WASM_OUT)/plimsoll_guest_js.wasm
PLIMSOLLD := $(CARGO_TARGET_DIR)/release/plimsolld
export PLIMSOLLD_BIN := $(PLIMSOLLD)
export PLIMSOLL_GUEST_JS_WASM := $(GUEST_WASM)

.PHONY: setup image guest build demo test audit bench bench-docker bench-e2b soak clean bench-mcp bench-startup bench-plugins

setup:
	@scripts/setup.sh

# The guest image the docker provider runs (Debian with node and python3),
# built locally: no registry is reachable. Kept if it exists.
image: setup
	images/build-sandbox-image.sh

# Every component in one cargo call: the QuickJS guest (which the host
# embeds, see host/build.rs), the shipped provider plugins, and the test
# fixtures. Shipped plugins go to target/plugins (plimsolld's default
# PLIMSOLL_PLUGIN_DIR); fixtures to target/test-plugins, never loaded by
# default.
guest: setup
	$(CARGO) build --target wasm32-wasip2 --profile guest \
		-p plimsoll-guest-js -p plimsoll-plugin-docker -p plimsoll-plugin-remote-plimsoll -p plimsoll-plugin-e2b -p plimsoll-plugin-dockercloud -p plimsoll-plugin-openshell -p plimsoll-fixture-hostile
	mkdir -p $(CARGO_TARGET_DIR)/plugins $(CARGO_TARGET_DIR)/test-plugins
	cp $(WASM_OUT)/plimsoll_plugin_remote_plimsoll.wasm $(CARGO_TARGET_DIR)/plugins/remote-plimsoll.wasm
	cp $(WASM_OUT)/plimsoll_plugin_e2b.wasm $(CARGO_TARGET_DIR)/plugins/e2b.wasm
	cp $(WASM_OUT)/plimsoll_plugin_dockercloud.wasm $(CARGO_TARGET_DIR)/plugins/dockercloud.wasm
	cp $(WASM_OUT)/plimsoll_plugin_openshell.wasm $(CARGO_TARGET_DIR)/plugins/openshell.wasm
	cp $(WASM_OUT)/plimsoll_fixture_hostile.wasm $(CARGO_TARGET_DIR)/test-plugins/hostile.wasm
	# The same adapter as remote-plimsoll, in JavaScript (componentize-js,
	# pinned in its package-lock.json): the contract is not Rust's alone.
	plugins/remote-js/build.sh $(CARGO_TARGET_DIR)/plugins/remote-js.wasm

build: guest
	$(CARGO) build --release -p plimsoll-host -p plimsoll-tests

demo: build
	@scripts/demo.sh examples/hello.js

test: build image
	scripts/leftovers.sh > $(CARGO_TARGET_DIR)/leftovers.before
	$(CARGO) test --release -p plimsoll-host -p plimsoll-tests -p plimsoll-plugin-probe
# The plugin's own tests run on their own: built with the host, its
# dependencies' features would change the host's build.
	$(CARGO) test --release -p plimsoll-plugin-openshell
	node plugins/remote-js/test.mjs $(CARGO_TARGET_DIR)/plugins/remote-js.wasm
	.venv/bin/python -m pytest -q tests/compat tests/session_agent
	.venv-e2b/bin/python -m pytest -q tests/fakes/e2b tests/fakes/dockercloud
	.venv-openshell/bin/python -m pytest -q tests/fakes/openshell
	python3 scripts/soak.py --short
	scripts/leftovers.sh --since $(CARGO_TARGET_DIR)/leftovers.before

audit: guest
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release -p plimsoll-host -p plimsoll-tests --all-targets -- -D warnings
	$(CARGO) clippy --target wasm32-wasip2 --profile guest \
		-p plimsoll-guest-js -p plimsoll-plugin-docker -p plimsoll-plugin-remote-plimsoll -p plimsoll-plugin-e2b -p plimsoll-plugin-dockercloud -p plimsoll-plugin-openshell -p plimsoll-plugin-wire -p plimsoll-plugin-probe -p plimsoll-fixture-hostile -- -D warnings
	$(MAKE) test

bench: build image
	$(CARGO_TARGET_DIR)/release/plimsoll-bench

# The docker provider beside plain `docker run --rm` of the same image and
# snippet, under runc and runsc (docs/benchmarks.md).
bench-docker: build image
	.venv/bin/python scripts/bench_docker.py
	.venv/bin/python scripts/bench_sessions_docker.py

# The E2B plugin's own overhead per run against fake-e2b over TLS
# (docs/benchmarks.md). BENCH_N runs, default 200.
bench-e2b: build image
	.venv/bin/python scripts/bench_e2b.py

# The same adapter in Rust and in JavaScript: size, start, per-run cost
# (docs/benchmarks.md).
bench-plugins: build
	.venv/bin/python scripts/bench_plugins.py

# MCP tools/call against Run over one connection, and how soon a docker
# run's first streamed chunk arrives after it is written (docs/benchmarks.md).
bench-mcp: build image
	.venv/bin/python scripts/bench_mcp.py

# Exec to first Run answered, with and without the compile cache
# (docs/benchmarks.md).
bench-startup: build
	.venv/bin/python scripts/bench_startup.py

# Tens of thousands of mixed runs; what each daemon holds before and after
# (docs/benchmarks.md). Bounded in time, not a timed test.
soak: build image
	python3 scripts/soak.py

clean:
	scripts/patch-wasmtime.sh
	$(CARGO) clean
