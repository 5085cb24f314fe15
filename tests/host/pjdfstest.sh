#!/usr/bin/env bash
# POSIX conformance on a host mount: pjdfstest (crates.io 0.2.2, the Rust rewrite, installed
# with `cargo install --locked` into ${XDG_CACHE_HOME:-$HOME/.cache}/daxfsd/pjdfstest) runs
# on a plain directory of the share's filesystem (the reference) and on daxfsd --mount
# (/dev/fuse, and /dev/fuse + FUSE passthrough) and in a guest on a virtio-fs mount served by
# daxfsd (profile pci). The set of tests passing on each must equal the reference's minus
# tests/host/pjdfstest-exceptions.txt (one reason per entry), and the host mounts must pass
# exactly the guest's. bindfs on the host and upstream virtiofsd 1.14 in the guest run the
# same as peers (reported, not failing).
#
#   tests/host/pjdfstest.sh [-d DAXFSD] [-t devfuse,passthrough,io-uring,guest,bindfs,guest-virtiofsd]
#
# io-uring (not in the default list; needs fuse.enable_uring=Y, which tests/host/io-uring.sh
# sets and restores): daxfsd --mount --io-uring=on without passthrough; its exit report must
# show requests served from the rings and none but INIT through read(2) (FORGET aside).
#
# Ends with "pjdfstest: N passed, M failed" (checks, not pjdfstest tests).
set -euo pipefail
RIG_TAG=pjdfstest
# shellcheck source=../../scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$RIG_ROOT"

daxfsd=$RIG_ROOT/target/debug/daxfsd transports="devfuse passthrough guest bindfs guest-virtiofsd"
while (($#)); do
    case $1 in
        -d) (($# >= 2)) || die "-d needs a value"; daxfsd=$2; shift 2 ;;
        -t) (($# >= 2)) || die "-t needs a value"; transports=${2//,/ }; shift 2 ;;
        *) die "unknown option '$1'" ;;
    esac
done
(($(id -u) == 0)) || die "run as root (pjdfstest switches users, mknod)"
[[ -x $daxfsd ]] || die "no daxfsd at $daxfsd (cargo build, or -d PATH)"
if ! getent passwd nobody >/dev/null || ! getent passwd daemon >/dev/null; then
    die "pjdfstest needs the users nobody and daemon"
fi

version=0.2.2
root=${XDG_CACHE_HOME:-$HOME/.cache}/daxfsd/pjdfstest
pjd=$root/bin/pjdfstest
if [[ ! -x $pjd ]] || [[ $("$pjd" --version 2>/dev/null) != *"$version"* ]]; then
    need_cmd cargo
    log "installing pjdfstest $version into $root (cargo install --locked, once)"
    nice -n 10 cargo install --locked pjdfstest --version "$version" --root "$root" >"$root.install.log" 2>&1 ||
        { tail -n 20 "$root.install.log" >&2; die "cargo install pjdfstest failed"; }
fi

# ok, bad, check and rig_summary come from scripts/lib.sh.

run=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-pjd.XXXXXX")
chmod 0755 "$run"
RIG_CLEANUP+=("pjd_cleanup")
pjd_cleanup() {
    local m
    for m in "$run"/m-*; do grep -q " $m " /proc/mounts && umount -l "$m"; done
    [[ -f $run/pid ]] && kill -KILL "$(cat "$run/pid")" 2>/dev/null
    rm -rf -- "$run"
}
# Features this Linux has; naptime above ext4's timestamp granularity (a jiffy); the dummy
# users are ones Debian has (nobody/nogroup, daemon/daemon) rather than created ones.
cat >"$run/pjd.toml" <<'EOF'
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["daemon", "daemon"],
]
EOF
mapfile -t exceptions < <(sed -n 's/^\([a-z0-9_:]*\) #.*/\1/p' tests/host/pjdfstest-exceptions.txt)

# pjd DIR OUT: runs the suite in DIR; OUT.pass and OUT.fail get the test names.
# Every directory under test has a path of the same length (m-XXXX): pjdfstest's
# ENAMETOOLONG cases build their paths from it, and some lengths hit an underflow in 0.2.2.
# A case that fails is run once more on its own (pjdfstest -e, its full name); OUT.retried
# names the cases that passed only then; they count as passed and every CHECK line says so.
# (open::etxtbsy failed now and then, for upstream virtiofsd too: its O_RDONLY|O_TRUNC open
# reached the daemon under FUSE_ATOMIC_O_TRUNC, which emptied the running copy of sleep
# before Linux refused the open. daxfsd no longer asks for that flag; ARCHITECTURE.md.)
pjd() {
    (cd "$1" && RUST_BACKTRACE=0 timeout 900 nice -n 10 "$pjd" -c "$run/pjd.toml" -p "$1") >"$2" 2>&1 || true
    sed -n 's/^\([a-z0-9_:]*\) \{1,\}ok$/\1/p' "$2" | sort -u >"$2.pass"
    sed -n 's/^\([a-z0-9_:]*\) \{1,\}FAILED$/\1/p' "$2" | sort -u >"$2.fail"
    : >"$2.retried"
    local t
    while read -r t; do
        (cd "$1" && RUST_BACKTRACE=0 timeout 120 nice -n 10 "$pjd" -c "$run/pjd.toml" -p "$1" -e "pjdfstest::tests::$t") >"$2.retry" 2>&1 || true
        if grep -qE "^$t +ok\$" "$2.retry"; then echo "$t" >>"$2.retried"; fi
    done <"$2.fail"
    retried_into "$2"
}

# retried_into OUT: moves the names in OUT.retried from OUT.fail to OUT.pass.
retried_into() {
    [[ -s $1.retried ]] || return 0
    sort -u "$1.pass" "$1.retried" -o "$1.pass"
    comm -23 "$1.fail" <(sort -u "$1.retried") >"$1.fail.new" && mv "$1.fail.new" "$1.fail"
}

# The note a CHECK line gets for cases that passed only on their retry.
retried_note() {
    [[ -s $1.retried ]] && printf '; passed on a retry: %s' "$(tr '\n' ' ' <"$1.retried")"
    return 0
}

mkdir "$run/m-refr"
log "reference: pjdfstest on $(stat -f -c %T "$run") ($run/m-refr)"
pjd "$run/m-refr" "$run/ref"
n_ref=$(wc -l <"$run/ref.pass")
if ((n_ref > 300)); then
    ok "reference ($n_ref passed, $(wc -l <"$run/ref.fail") failed)"
else
    bad reference "only $n_ref tests passed: $(tail -n 3 "$run/ref")"
fi
printf '%s\n' "${exceptions[@]}" | sort -u >"$run/exceptions"
comm -23 "$run/ref.pass" "$run/exceptions" >"$run/expected"

# guest DAEMON T OUT: pjdfstest in a guest on the virtio-fs mount (profile pci), at a path of
# the same length (m-gues). The binary and libgcc travel in the share; the initramfs has the
# loader and libc (the host's, copied for fio) and gets the two dummy users.
guest() {
    local d=$1 share=$run/share-$2 rc=0
    mkdir -p "$share/.pjd"
    cp "$pjd" "$run/pjd.toml" "$share/.pjd/"
    cp -L "$(ldd "$pjd" | awk '$1 == "libgcc_s.so.1" { print $3 }')" "$share/.pjd/"
    # The *::etxtbsy cases copy `which sleep` and run the copy for 10 s, then expect ETXTBSY.
    # The guest's sleep is a busybox applet: a copy under another name is busybox looking for
    # an applet of that name, which exits at once ("applet not found"), so the case passed
    # only when its open came before that exit (open::etxtbsy's failures under load). A real
    # sleep (coreutils; libc is in the initramfs) comes first on the guest's PATH.
    mkdir -p "$share/.pjd/bin"
    cp -L /usr/bin/sleep "$share/.pjd/bin/sleep"
    cat >"$run/guest-$2.sh" <<'GUEST'
export PATH=/mnt/.pjd/bin:$PATH
echo "PJD sleep is $(which sleep): $(sleep --version 2>&1 | head -n 1)"
printf 'nobody:x:65534:65534:nobody:/nonexistent:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/bin/sh\n' >>/etc/passwd
printf 'nogroup:x:65534:\ndaemon:x:1:\n' >>/etc/group
check pjdfstest_on_share [ -x /mnt/.pjd/pjdfstest ]
mkdir -p /mnt/m-gues && cd /mnt/m-gues || exit 1
RUST_BACKTRACE=0 /lib64/ld-linux-x86-64.so.2 --library-path /mnt/.pjd:/usr/lib/x86_64-linux-gnu \
    /mnt/.pjd/pjdfstest -c /mnt/.pjd/pjd.toml -p /mnt/m-gues >/tmp/pjd.out 2>&1
echo "PJD-RC $?"
sed -n 's/^\([a-z0-9_:]*\) \{1,\}\(ok\|FAILED\|skipped\)$/PJD \2 \1/p' /tmp/pjd.out
# The whole output (with each failure's reason) travels to the host, kept there on failure.
sed 's/^/PJDOUT /' /tmp/pjd.out
for t in $(sed -n 's/^\([a-z0-9_:]*\) \{1,\}FAILED$/\1/p' /tmp/pjd.out); do
    RUST_BACKTRACE=0 /lib64/ld-linux-x86-64.so.2 --library-path /mnt/.pjd:/usr/lib/x86_64-linux-gnu \
        /mnt/.pjd/pjdfstest -c /mnt/.pjd/pjd.toml -p /mnt/m-gues -e "pjdfstest::tests::$t" >/tmp/pjd.retry 2>&1
    sed "s/^/PJDRETRY $t /" /tmp/pjd.retry
    grep -qE "^$t +ok\$" /tmp/pjd.retry && echo "PJD retried $t"
done
guest_end
GUEST
    [[ $d == daxfsd ]] && d=$daxfsd
    TMPDIR=$run nice -n 10 scripts/vm.sh -p pci -d "$d" -a --xattr -s "$share" \
        --script "$run/guest-$2.sh" -T 900 >"$3" 2>"$3.err" || rc=$?
    # Its helpers (check, guest_end) are tests/e2e/guest/lib.sh's, sent by vm.sh; cut short,
    # it is one failed check T/guest/incomplete (a PEER line for the peer, virtiofsd).
    [[ $2 != guest-virtiofsd ]] || RIG_PEER=1
    guest_complete "$2/guest" "$3" "$rc"
    RIG_PEER=0
    sed -n 's/^PJD ok //p' "$3" | sort -u >"$3.pass"
    sed -n 's/^PJD FAILED //p' "$3" | sort -u >"$3.fail"
    sed -n 's/^PJD retried //p' "$3" | sort -u >"$3.retried"
    retried_into "$3"
    sed -n 's/^PJDOUT //p' "$3" >"$3.full"
}

# keep_output T: a transport's full pjdfstest output (and its retries' and the guest's
# console) copied out of the run directory, which is removed at exit; prints where.
keep_output() {
    local dest
    dest=$DAXFSD_CACHE/logs/pjdfstest-$(date +%Y%m%d-%H%M%S)-$1
    mkdir -p "$dest"
    cp -- "$run/$1"* "$dest/" 2>/dev/null || true
    printf '%s' "$dest"
}

for t in $transports; do
    if [[ $t == guest || $t == guest-virtiofsd ]]; then
        dmn=daxfsd
        [[ $t == guest-virtiofsd ]] && dmn=virtiofsd
        log "$t: pjdfstest in a guest (virtio-fs, $dmn)"
        guest "$dmn" "$t" "$run/$t"
        [[ ! -s $run/$t.retried ]] || log "$t: cases that passed only on a retry; output kept in $(keep_output "$t")"
        missing=$(comm -23 "$run/expected" "$run/$t.pass" | tr '\n' ' ')
        extra=$(comm -13 "$run/expected" "$run/$t.pass" | tr '\n' ' ')
        if [[ $t == guest-virtiofsd ]]; then
            printf 'PEER virtiofsd (guest): %d passed, %d failed; missing against the reference: %s%s\n' \
                "$(wc -l <"$run/$t.pass")" "$(wc -l <"$run/$t.fail")" "${missing:-none}" "$(retried_note "$run/$t")"
        elif [[ -s $run/$t.pass && -z $missing && -z $extra ]]; then
            ok "$t: passes the reference's $n_ref minus ${#exceptions[@]} exception(s) ($(wc -l <"$run/$t.pass") passed, $(wc -l <"$run/$t.fail") failed$(retried_note "$run/$t"))"
        else
            bad "$t" "missing: ${missing:-none}; beyond: ${extra:-none}; failed: $(tr '\n' ' ' <"$run/$t.fail") $(tail -n 3 "$run/$t.err"); full output kept in $(keep_output "$t")"
        fi
        continue
    fi
    m=$run/m-${t:0:4}
    mkdir -p "$run/share-$t" "$m"
    case $t in
        devfuse|passthrough|io-uring)
            pt=off; [[ $t == passthrough ]] && pt=auto
            ur=off; [[ $t == io-uring ]] && ur=on
            "$daxfsd" --shared-dir "$run/share-$t" --mount "$m" --xattr --passthrough=$pt --io-uring=$ur \
                --log-level info </dev/null >"$run/$t.log" 2>&1 &
            echo $! >"$run/pid" ;;
        bindfs) bindfs -o allow_other,dev,suid "$run/share-$t" "$m" ;;
        *) die "unknown transport '$t'" ;;
    esac
    for ((i = 0; i < 100; i++)); do grep -q " $m " /proc/mounts && break; sleep 0.1; done
    log "$t: pjdfstest on $m"
    pjd "$m" "$run/$t"
    if [[ $t == bindfs ]]; then
        umount "$m"
        printf 'PEER bindfs: %d passed, %d failed; missing against the reference: %s\n' \
            "$(wc -l <"$run/$t.pass")" "$(wc -l <"$run/$t.fail")" \
            "$(comm -23 "$run/expected" "$run/$t.pass" | tr '\n' ' ')"
        continue
    fi
    kill -TERM "$(cat "$run/pid")"; wait "$(cat "$run/pid")" || true; rm -f "$run/pid"
    missing=$(comm -23 "$run/expected" "$run/$t.pass" | tr '\n' ' ')
    extra=$(comm -13 "$run/expected" "$run/$t.pass" | tr '\n' ' ')
    if [[ -z $missing && -z $extra ]]; then
        ok "$t: passes the reference's $n_ref minus ${#exceptions[@]} exception(s) ($(wc -l <"$run/$t.pass") passed, $(wc -l <"$run/$t.fail") failed$(retried_note "$run/$t"))"
    else
        bad "$t" "missing: ${missing:-none}; passing beyond reference minus exceptions (drop them from the list): ${extra:-none}; failed: $(tr '\n' ' ' <"$run/$t.fail"); full output kept in $(keep_output "$t")"
    fi
    [[ ! -s $run/$t.retried ]] || log "$t: cases that passed only on a retry; output kept in $(keep_output "$t")"
    if [[ $t == io-uring ]]; then
        line=$(grep -o 'read(2) requests other than.*' "$run/$t.log" | tail -n 1)
        n=$(sed -n 's/.*io-uring: \([0-9]*\) requests served from.*/\1/p' <<<"$line")
        if [[ $n =~ ^[0-9]+$ ]] && ((n > 0)) && [[ $line == *"FORGET/INTERRUPT: 1;"* ]]; then
            ok "$t: rings used ($line)"
        else
            bad "$t: rings used" "${line:-no report: $(tail -n 2 "$run/$t.log")}"
        fi
    fi
    if [[ $t == passthrough ]]; then
        line=$(grep -o 'passthrough: [0-9]* backing files opened.*' "$run/$t.log" | tail -n 1)
        n=${line#passthrough: }; n=${n%% *}
        if [[ $n =~ ^[0-9]+$ ]] && ((n > 0)); then ok "$t: passthrough used ($line)"; else bad "$t: passthrough used" "${line:-no report}"; fi
    fi
done
for a in devfuse passthrough io-uring; do
    [[ -f $run/$a.pass && -s $run/guest.pass ]] || continue
    if cmp -s "$run/$a.pass" "$run/guest.pass"; then
        ok "$a passes the same tests as the guest ($(wc -l <"$run/guest.pass"))"
    else
        bad "$a: same tests as the guest" "$(diff "$run/guest.pass" "$run/$a.pass" | head -n 6 | tr '\n' ' ')"
    fi
done
rig_summary pjdfstest
