# daxfsd
#
#   make            build the daemon (debug)          make release   optimized build
#   make demo       boot a guest with a DAX share, run fio, print DAX vs non-DAX
#   make test       every test: lint, unit + protocol, fuzz smoke, VM end-to-end
#   make bench      the benchmark matrix (results under bench/results/)
#
# Parts of `make test`: lint, test-unit (cargo tests; protocol tests against daxfsd and
# upstream virtiofsd), test-fuzz (each fuzz target FUZZ_SECONDS), test-e2e (guest suite
# against daxfsd on the pci and mmio profiles), test-e2e-virtiofsd (the same suite against
# upstream virtiofsd), test-dax (DAX end to end on QEMU 11.1).
# VM rig targets (kernel, initramfs, qemu, virtiofsd, vm, ...): see mk/vm.mk.

CARGO ?= cargo
FUZZ_SECONDS ?= 60
DAXFSD_BIN := target/debug/daxfsd

.PHONY: all build release lint fmt test test-unit test-fuzz test-dax test-escape fuzz demo bench clean
all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p daxfsd

DAEMON_DEPS := build
include mk/vm.mk

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Unit, server and protocol-level tests. The driver's tests run twice: against daxfsd, and
# against upstream virtiofsd (proof that they test the protocol, not daxfsd's quirks).
test-unit: build virtiofsd
	$(CARGO) test --workspace
	VUFS_DAEMON=daxfsd DAXFSD=$(abspath $(DAXFSD_BIN)) $(CARGO) test -p vufs-driver

fuzz test-fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

# DAX end to end on QEMU 11.1: the DAX checks, then the whole guest suite on a dax=always mount.
test-dax: kernel initramfs qemu build
	tests/e2e/dax.sh
	tests/e2e/run.sh -p dax -o dax=always -a --dax-window=256M

# The DAX checks again with the guest kernel's upstream (Linux 6.12) window policy,
# -o dax_policy=upstream; test-dax covers the default (hybrid) policy of guest-kernel/patches.
.PHONY: test-dax-policy
test-dax-policy: kernel initramfs qemu build
	tests/e2e/dax.sh --dax-policy upstream

# Escape attempts from a guest against the default sandbox; the host checks nothing changed.
test-escape: kernel initramfs qemu build
	tests/e2e/escape.sh

test: lint test-unit test-fuzz test-e2e test-e2e-virtiofsd test-dax test-escape
	@echo "make test: all suites passed"

demo: kernel initramfs qemu release
	scripts/demo.sh

bench: kernel initramfs qemu virtiofsd release
	scripts/bench.sh $(if $(QUICK),--quick)

clean:
	$(CARGO) clean
