# daxfsd
#
#   make            build the daemon (debug)          make release   optimized build
#   make demo       boot a guest with a DAX share, run fio, print DAX vs non-DAX
#   make test       every test (the list below); .ci/run runs exactly this
#   make bench      the benchmark matrix (results under bench/results/)
#
# Every top-level target first installs its section of the one Debian package list,
# scripts/provision-deps.sh (rig: demo, vm, and all below; test; bench).
#
# Parts of `make test`, in order:
#   space         at least 6 GiB free for target/ and the cache, or a one-line error
#   deps-test     the packages tests use (scripts/provision-deps.sh rig test)
#   lint          cargo fmt, clippy -D warnings, shellcheck over every shell script
#   test-rig      the test rig's own negative controls: a sub-suite that dies after its
#                 first check fails its runner, one runner per kind of sub-suite
#                 (tests/rig-selftest.sh --per-kind; test-rig-all: every runner)
#   test-unit     cargo tests; protocol tests against daxfsd and upstream virtiofsd
#   test-uidmap   --uid-map/--gid-map with a non-root daemon, daxfsd and virtiofsd
#   test-fuzz     each fuzz target for FUZZ_SECONDS
#   test-e2e, test-e2e-virtiofsd   the guest suite (pci, mmio) against daxfsd, virtiofsd
#   test-dax, test-dax-policy, test-dax-copy   DAX end to end on QEMU 11.1
#   test-dax-host, test-dax-full   host truncates of mapped files; a full or immutable share
#   test-notify   host changes reach guest inotify and fanotify watchers and caches (notification queue);
#                 its host burst is NOTIFY_BURST creates (100,000, the issue's; 20,000 is
#                 enough to pass the daemon's queue cap for a quicker run)
#   test-escape, test-lifecycle, test-migrate  escapes, stop/cont/SIGTERM, the file server
#                 killed and upgraded under a guest (test-restart), live migration
#   test-launchers, test-lima      libvirt, virtme-ng, Kata, podman, lima
#   test-acl, test-fhandles        POSIX ACLs/xattrmap, file-handle descriptors
#   test-never                     --cache=never: host changes at the next call, requests per walk
#   test-host, test-io-uring       the same server on /dev/fuse, passthrough, io-uring
#   test-fstests  fstests (curated list) on --cache=auto and DAX pooled against ext4 in the
#                 same guest, and its negative control (a --readonly daemon must fail it)
# Not in `make test`: make test-rig-all (the rig's negative control for every runner, not one
# per kind).
# make conformance (not in `make test`): a broader fstests list on more configurations and on
# upstream virtiofsd, as a table.
# VM rig targets (kernel, initramfs, qemu, virtiofsd, vm, ...): see mk/vm.mk.

CARGO ?= cargo
FUZZ_SECONDS ?= 60
DAXFSD_BIN := target/debug/daxfsd

.PHONY: all build release lint fmt test test-unit test-fuzz test-dax test-dax-copy test-escape test-lifecycle fuzz demo bench clean install uninstall test-launchers
all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p daxfsd

DAEMON_DEPS := build
include mk/vm.mk

lint: deps-test
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	scripts/lint-shell.sh

# The rig's runners fail when a sub-suite dies part way (negative controls): in `make test`
# one runner per kind of sub-suite (the helpers with fakes, run_subsuite, the suite on a
# mount, the guest suite, a packed guest command, a guest script: ~25 s); test-rig-all: every
# runner (~5 min, lima 3.5 of them).
.PHONY: test-rig test-rig-all
test-rig: deps-test kernel initramfs qemu virtiofsd build
	tests/rig-selftest.sh --per-kind

test-rig-all: deps-test kernel initramfs qemu virtiofsd build
	tests/rig-selftest.sh

fmt:
	$(CARGO) fmt --all

# Unit, server and protocol-level tests, and the bench's statistics (doctests). The driver's
# tests run twice: against daxfsd, and against upstream virtiofsd (proof that they test the
# protocol, not daxfsd's quirks). Its DAX tests run with direct mappings, then again pooled
# (the daemon's default; tests of a direct-only mechanism name --dax-mapping=direct).
DAX_DRIVER_TESTS := --test dax --test dax_abuse --test dax_coherence --test dax_copy --test dax_host --test dax_limits
# Protocol tests run once more through the holder (--restartable): its relay of every
# vhost-user message, device-state transfer and dirty log included.
HOLDER_DRIVER_TESTS = --test fuse_ops --test posix_edges --test lock_waits --test migration --test hostile
test-unit: build virtiofsd
	$(CARGO) test --workspace
	python3 -m doctest bench/benchlib.py
	VUFS_DAEMON=daxfsd DAXFSD=$(abspath $(DAXFSD_BIN)) $(CARGO) test -p vufs-driver
	VUFS_DAEMON=daxfsd DAXFSD=$(abspath $(DAXFSD_BIN)) VUFS_DAX_MAPPING=pooled $(CARGO) test -p vufs-driver $(DAX_DRIVER_TESTS)
	VUFS_DAEMON=daxfsd DAXFSD=$(abspath $(DAXFSD_BIN)) VUFS_DAEMON_ARGS=--restartable $(CARGO) test -p vufs-driver $(HOLDER_DRIVER_TESTS)

# --uid-map/--gid-map: a non-root daemon (user daxfsd-test, created with its /etc/subuid and
# /etc/subgid ranges by scripts/uidmap-test-setup.sh) against daxfsd, then virtiofsd 1.14.
test-uidmap: deps-test build virtiofsd
	VUFS_DAEMON=daxfsd DAXFSD=$(abspath $(DAXFSD_BIN)) $(CARGO) test -p vufs-driver --test uidmap
	VUFS_DAEMON=virtiofsd $(CARGO) test -p vufs-driver --test uidmap

.PHONY: test-uidmap

# POSIX ACLs (--posix-acl), --xattrmap and --translate-uid/gid checked in real guests and on
# the host, against daxfsd, then virtiofsd 1.14.
test-acl: kernel initramfs qemu virtiofsd build
	tests/e2e/acl.sh
	tests/e2e/acl.sh -d virtiofsd
.PHONY: test-acl

# Descriptors held after a guest walks 10,100 inodes: O_PATH fds vs file handles
# (--inode-file-handles never/prefer/mandatory), daxfsd and virtiofsd 1.14 side by side.
test-fhandles: kernel initramfs qemu virtiofsd build
	tests/e2e/fhandles.sh
.PHONY: test-fhandles
# --cache=never (tests/e2e/never.sh): host chmod, append and rename seen at the guest's next
# system call (virtiofsd too; --cache=always as the negative control), and a walk's GETATTRs
# per entry (guest patch 0016).
test-never: kernel initramfs qemu virtiofsd build
	tests/e2e/never.sh
.PHONY: test-never
# make fuzz: each target for FUZZ_SECONDS, then what it found merged into the committed
# corpus (fuzz/corpus). make test-fuzz: the same run, corpus untouched.
# make fuzz-long: each target for FUZZ_LONG_SECONDS (default 1800); at the rates measured
# here under load (6,000 to 9,000 executions/s; migration_stream far more) that is about
# 10 million executions per target or more. Executions per target are printed at the end.
FUZZ_LONG_SECONDS ?= 1800
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh --grow
test-fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh
fuzz-long:
	FUZZ_SECONDS=$(FUZZ_LONG_SECONDS) scripts/fuzz.sh --grow
.PHONY: fuzz-long

# DAX end to end on QEMU 11.1: the DAX checks, I/O whose buffer is a DAX mapping (pooled and
# direct), then the whole guest suite on a dax=always mount.
test-dax: kernel initramfs qemu build
	tests/e2e/dax.sh
	tests/e2e/dax-buffers.sh
	tests/e2e/run.sh -p dax -o dax=always -a --dax-window=256M

# The VM lifecycle: stop/cont through QEMU's monitor (pci: daxfsd and upstream virtiofsd; dax:
# DAX window), SIGTERM with dirty DAX shadow tails; 80 guest lock waiters on an overlayfs share
# all get the lock after the holder's close (about 30 s); three upgrades of the file server
# under a running guest with --restartable, on vhost-user-fs-pci and on the DAX window, pooled
# and direct (test-restart, about 35-60 s each).
test-lifecycle: kernel initramfs qemu virtiofsd build
	tests/e2e/lifecycle.sh
	tests/e2e/lock-waiters.sh
	tests/e2e/restart.sh
	tests/e2e/restart.sh --profile dax
	tests/e2e/restart.sh --profile dax --mapping direct

.PHONY: test-restart
test-restart: kernel initramfs qemu build
	tests/e2e/restart.sh
	tests/e2e/restart.sh --profile dax
	tests/e2e/restart.sh --profile dax --mapping direct

# The DAX checks again with the guest kernel's upstream (Linux 6.12) window policy,
# -o dax_policy=upstream, and the daemon's default mapping (pooled): what a user with an
# upstream guest kernel gets; test-dax covers the default (hybrid) policy of
# guest-kernel/patches with direct mappings.
.PHONY: test-dax-policy
test-dax-policy: kernel initramfs qemu build
	tests/e2e/dax.sh --dax-policy upstream --dax-mapping pooled

# The DAX suite with every read-only range served from a copy slot (daxfsd --dax-copy=always);
# test-dax runs the default (auto), which copies only while the window churns.
.PHONY: test-dax-copy
test-dax-copy: kernel initramfs qemu build
	tests/e2e/dax.sh --dax-copy always

# Host truncates, rename-over and unlink of files a DAX guest reads (fd and mmap readers,
# --cache never and auto): QEMU and the daemon live on, the guest sees the new bytes.
.PHONY: test-dax-host
test-dax-host: kernel initramfs qemu build
	tests/e2e/dax-host.sh

# A DAX guest writing (write+fsync, mmap+msync) while the share's host file system is full (a
# small tmpfs, an ext4 image on a loop device) or its file immutable, pooled and direct: the
# guest gets the errno (or SIGBUS for mmap stores, direct), QEMU and the daemon live, and once
# the host frees space the rewrite lands byte for byte. Root (mounts); about 4 boots.
.PHONY: test-dax-full
test-dax-full: kernel initramfs qemu build
	tests/e2e/dax-full.sh

# The virtio-fs notification queue (issue 42, guest-kernel patches 0011-0014): a guest
# inotifywait and a fanotify watcher see host creates, writes, chmods, renames and deletes in
# order within a bound, a cached file shows a host edit at the next read, the guest's own
# changes give one event each (daxfsd --cache=coherent); a device without the queue still mounts and works; a host
# burst of NOTIFY_BURST creates overflows the daemon's queue (4,096), keeps its memory bounded
# and the guest consistent, its watcher gets every create or IN_Q_OVERFLOW, and stop/cont in
# the middle of a burst loses nothing. 3 boots, ~60 s (NOTIFY_BURST=20000: ~40 s).
NOTIFY_BURST ?= 100000
.PHONY: test-notify
test-notify: kernel initramfs qemu build
	tests/e2e/notify.sh --burst $(NOTIFY_BURST)

# One hour of a DAX guest under pressure (fio verify over 4x the window, psync and mmap) while
# the host edits, truncates and replaces shared files and the VM is paused and resumed: not in
# `make test`. SOAK_SECONDS=600 for a shorter run; SOAK_ARGS="--mapping direct --pause-every 0"
# for direct mappings (QEMU 11.1.3 can crash on a `stop` while they move: README, Limits).
.PHONY: soak
soak: kernel initramfs qemu build
	tests/e2e/soak.sh $(SOAK_ARGS)

# Escape attempts from a guest against the default sandbox; the host checks nothing changed.
test-escape: kernel initramfs qemu build
	tests/e2e/escape.sh

# Live migration end to end: two QEMU 11.1 guests with vhost-user-fs-pci, two daemons; both
# migration modes and a refused (corrupted) state with daxfsd, then the same migrations with
# upstream virtiofsd.
.PHONY: test-migrate
test-migrate: kernel initramfs qemu virtiofsd build
	tests/e2e/migrate.sh
	tests/e2e/migrate.sh -d virtiofsd

# The same server on a host mount (daxfsd --mount, /dev/fuse): the guest suite, host checks
# and escape checks for /dev/fuse and /dev/fuse + FUSE passthrough (counters > 0), bindfs as
# the peer (reported, not failing), a stale mount after SIGKILL, a non-root mount; then
# pjdfstest (installed into the cache once) on both mounts and in a guest (pci profile)
# against a plain-directory reference, bindfs and upstream virtiofsd as peers. Root; ~1.5 min.
.PHONY: test-host
test-host: kernel initramfs qemu virtiofsd build
	tests/host/run.sh -d $(abspath $(DAXFSD_BIN))
	tests/host/pjdfstest.sh -d $(abspath $(DAXFSD_BIN))

# FUSE-over-io-uring on a host mount (root; sets fuse.enable_uring for the run and restores
# it): --io-uring=on/auto with the transport off and on, the rings proven to serve, the guest
# suite, host and escape checks (tests/host/run.sh -t io-uring) and pjdfstest
# (tests/host/pjdfstest.sh -t io-uring) over the rings, a waiting lock that must not stall its
# queue, a clean stop on a busy mount. About 30 s.
# (daemon/tests/fuse_uring.rs, in test-unit, covers the fallback when rings cannot start.)
.PHONY: test-io-uring
test-io-uring: build
	tests/host/io-uring.sh $(DAXFSD_BIN)

# Space for target/ (debug, fuzz, examples: about 5.5 GiB from a clean clone) and the cache.
.PHONY: space
space:
	@scripts/check-space.sh 6 target $${XDG_CACHE_HOME:-$$HOME/.cache}/daxfsd

# fstests (issue 38; tests/fstests/README.md): a Debian 12 guest root with fstests built from
# ../shared/vendor (debootstrap, cached by the tarball's checksum and the package list) and the
# guest kernel with tests/fstests/kernel.fragment (block devices, ext4; its own cache key).
.PHONY: fstests-image test-fstests conformance
fstests-image: deps-rig
	@guest-kernel/build.sh --fragment tests/fstests/kernel.fragment >/dev/null
	@tests/fstests/build-root.sh >/dev/null

# The curated list (tests/fstests/quick.list) on daxfsd --cache=auto (vhost-user-fs-pci) and DAX
# pooled (-o dax=always, 256M window, QEMU 11.1), each against ext4 on virtio-blk in the same
# guest; a test that passes on ext4 and fails here fails the target unless
# tests/fstests/accepted.list gives the reason. Then the negative control: the same harness
# against --readonly daemons must fail. 3.5 minutes warm (idle machine).
test-fstests: fstests-image qemu build
	tests/fstests/test.sh

# The broader list (tests/fstests/conformance.list) on daxfsd never/auto/always, DAX pooled and
# DAX direct, and upstream virtiofsd never/auto/always, with ext4 as the reference: a table.
# Hours under TCG; not in `make test`. CONFORMANCE_ARGS='--configs "daxfsd-auto virtiofsd-auto"';
# '--backing ext4,xfs,btrfs,tmpfs,overlay,nfs' puts the shares on those host file systems
# (root; the xfs/btrfs tools and the NFS server come from deps-conformance).
CONFORMANCE_ARGS ?=
conformance: deps-conformance fstests-image qemu virtiofsd build
	tests/fstests/conformance.sh $(CONFORMANCE_ARGS)

test: space deps-test lint test-rig test-unit test-uidmap test-fuzz test-e2e test-e2e-virtiofsd test-dax test-dax-policy test-dax-copy test-dax-host test-dax-full test-notify test-escape test-lifecycle test-migrate test-launchers test-acl test-fhandles test-never test-lima test-host test-io-uring test-fstests
	@echo "make test: all suites passed"

demo: kernel initramfs qemu release
	scripts/demo.sh

bench: deps-bench kernel initramfs qemu virtiofsd release
	scripts/bench.sh $(if $(QUICK),--quick)

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary, the vhost-user backend
# descriptor (libvirt and lima find daxfsd through it; libvirt reads
# /usr/share/qemu/vhost-user and /etc/qemu/vhost-user, so use PREFIX=/usr or copy it to
# /etc/qemu/vhost-user) and the man page, generated from the clap definitions of --help.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
install: release
	install -D -m 0755 target/release/daxfsd $(DESTDIR)$(BINDIR)/daxfsd
	install -d $(DESTDIR)$(DATADIR)/qemu/vhost-user $(DESTDIR)$(MANDIR)/man1
	sed 's|@BINDIR@|$(BINDIR)|' packaging/50-daxfsd.json.in > $(DESTDIR)$(DATADIR)/qemu/vhost-user/50-daxfsd.json
	$(CARGO) run -q --release -p daxfsd --example mangen > $(DESTDIR)$(MANDIR)/man1/daxfsd.1

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/daxfsd $(DESTDIR)$(DATADIR)/qemu/vhost-user/50-daxfsd.json $(DESTDIR)$(MANDIR)/man1/daxfsd.1

# The launchers that start virtiofsd (libvirt, virtme-ng, Kata's and podman's command
# lines), installed by the test itself, each also run against upstream virtiofsd 1.14.
test-launchers: deps-test kernel initramfs virtiofsd build
	DAXFSD=$(abspath $(DAXFSD_BIN)) tests/launchers/run.sh

# lima (limactl 1.2.1 built from its Go module) starting a guest with a virtiofs mount: it
# finds daxfsd through the installed vhost-user descriptor; then the same with virtiofsd.
test-lima: kernel initramfs virtiofsd build
	tests/launchers/lima.sh
	tests/launchers/lima.sh -d virtiofsd
.PHONY: test-lima

clean:
	$(CARGO) clean
