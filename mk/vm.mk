# VM test rig (issue 4): guest kernel, initramfs, QEMUs, upstream virtiofsd,
# the VM launcher and the end-to-end suite. Included by the top Makefile.
#
#   make vm-deps            apt-install every Debian package of scripts/provision-deps.sh
#   make deps-rig|deps-test|deps-bench|deps-conformance   one section of it
#   make kernel             guest bzImage (cached; ~5-9 min cold on 2 cores)
#   make initramfs          busybox + fio + test helper cpio (cached)
#   make qemu               Debian's QEMU 7.2 + QEMU 11.1 from trixie-backports
#   make virtiofsd          upstream virtiofsd 1.14.0 (reference daemon)
#   make vm                 interactive guest shell, share mounted on /mnt
#   make test-e2e           e2e suite against $(DAEMON) on $(E2E_PROFILES)
#   make test-e2e-virtiofsd the same against upstream virtiofsd
#   make vm-lint            shellcheck every shell script (part of `make lint`)
#
# Variables (override on the command line or in the top Makefile):
#   DAXFSD_CACHE    where everything built or downloaded is cached
#   DAEMON          daxfsd (target/{release,debug}/daxfsd), virtiofsd, or a path
#   DAEMON_DEPS     targets that build $(DAEMON) first (top Makefile sets it)
#   VM_PROFILE      profile for `make vm`: pci, dax, mmio
#   SHARED          directory `make vm` shares (default: a fresh temp dir)
#   VM_ARGS         extra scripts/vm.sh options, e.g. VM_ARGS='-o dax=always -a --xattr'
#   E2E_PROFILES    profiles the suite runs on
#   E2E_ARGS        extra tests/e2e/run.sh options
#   ACCEL           tcg (default) or kvm

VM_RIG_DIR := $(patsubst %/mk/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))

DAXFSD_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/daxfsd
export DAXFSD_CACHE
DAEMON ?= daxfsd
DAEMON_DEPS ?=
VM_PROFILE ?= pci
SHARED ?=
VM_ARGS ?=
E2E_PROFILES ?= pci mmio
E2E_ARGS ?=

.PHONY: vm-deps deps-rig deps-test deps-bench deps-conformance kernel initramfs qemu virtiofsd vm test-e2e test-e2e-virtiofsd vm-lint

vm-deps:
	@$(VM_RIG_DIR)/scripts/provision-deps.sh all
deps-rig deps-test deps-bench deps-conformance:
	@$(VM_RIG_DIR)/scripts/provision-deps.sh $(patsubst deps-%,%,$@)

kernel: deps-rig
	@$(VM_RIG_DIR)/guest-kernel/build.sh >/dev/null

initramfs: deps-rig
	@$(VM_RIG_DIR)/scripts/build-initramfs.sh >/dev/null

qemu: deps-rig
	@$(VM_RIG_DIR)/scripts/provision-qemu.sh all

virtiofsd: deps-rig
	@$(VM_RIG_DIR)/scripts/provision-virtiofsd.sh >/dev/null

# The daemon a target runs needs building (daxfsd) or installing (virtiofsd).
vm_daemon_deps = $(if $(filter virtiofsd,$(DAEMON)),virtiofsd,$(if $(filter daxfsd,$(DAEMON)),$(DAEMON_DEPS)))

vm: kernel initramfs qemu $(vm_daemon_deps)
	@$(VM_RIG_DIR)/scripts/vm.sh -p $(VM_PROFILE) -d $(DAEMON) -t shell -T 0 $(if $(SHARED),-s $(SHARED)) $(VM_ARGS)

test-e2e: kernel initramfs qemu $(vm_daemon_deps)
	@$(VM_RIG_DIR)/tests/e2e/run.sh -d $(DAEMON) -p "$(E2E_PROFILES)" $(E2E_ARGS)

test-e2e-virtiofsd: kernel initramfs qemu virtiofsd
	@$(VM_RIG_DIR)/tests/e2e/run.sh -d virtiofsd -p "$(E2E_PROFILES)" $(E2E_ARGS)

vm-lint:
	@$(VM_RIG_DIR)/scripts/lint-shell.sh
