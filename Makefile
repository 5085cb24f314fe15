# daxfsd: `make` builds, `make test` runs every test, `make demo` shows DAX vs non-DAX.
CARGO ?= cargo

.PHONY: all build release test test-unit lint fmt clean
all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --workspace --release

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

test-unit:
	$(CARGO) test --workspace

test: lint test-unit

clean:
	$(CARGO) clean
