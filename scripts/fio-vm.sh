#!/usr/bin/env bash
# Boots one guest with scripts/vm.sh and runs fio jobs on its virtio-fs mount; each job's
# fio JSON lands in OUT/<job>.json and a summary line per job is printed.
#
#   scripts/fio-vm.sh --out DIR [options] JOB...
#
#   JOB                  NAME:RW:ENGINE[:IODEPTH[:NUMJOBS[:SIZE[:NRFILES[:WHERE]]]]],
#                        e.g. randread-psync:randread:psync
#                        (NUMJOBS > 1 gives each job its own file, like the seed's "multi")
#                        SIZE: the job gets its own files of SIZE (NUMJOBS x NRFILES of them,
#                        default NRFILES 1, picked at random per I/O) instead of the shared
#                        data files of --file-size; WHERE=tmpfs puts them on a tmpfs in the
#                        guest (fio lays them out there), the guest's own ceiling
#   --out DIR            where the JSON results go (created)
#   -p, --profile NAME   QEMU profile (default: dax)
#   -d, --daemon D       daxfsd-release (default), daxfsd (debug build), virtiofsd or a path
#   -a, --daemon-arg A   extra daemon argument (repeatable)
#   --cache MODE         daemon cache mode (default: never)
#   -o, --mount-opts O   guest mount options, e.g. dax=always
#   --file-size SIZE     size of each data file (default: 128M)
#   --runtime SEC        seconds per job (default: 10)
#   --bs SIZE            block size (default: 4k)
#   --cpus N, --mem SIZE, --queues N   guest shape (defaults 1, 1G, 1)
#   --kernel FILE        guest bzImage (default: guest-kernel/build.sh's)
#   --log FILE           serial console log (daemon log: FILE with .daemon.log)
#   --marks              time-stamp each job on the host: OUT/<job>.marks holds the host
#                        times (epoch seconds) at which the job started and ended, taken from
#                        the mtimes of marker files the guest creates on the share
# Data files are made on the host with random content before boot, in a fresh share that
# is removed afterwards.
set -euo pipefail
RIG_TAG=fio-vm
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

out="" profile=dax daemon=daxfsd-release cache=never mountopts="" fsize=128M runtime=10 bs=4k
cpus=1 mem=1G queues=1 logfile="" marks=0 kernel=""
daemon_args=() jobs=()
need_arg() { (($1 >= 2)) || die "option $2 needs a value (see the header of $0)"; }
while (($#)); do
    case $1 in
        --out) need_arg $# "$1"; out=$2; shift 2 ;;
        -p|--profile) need_arg $# "$1"; profile=$2; shift 2 ;;
        -d|--daemon) need_arg $# "$1"; daemon=$2; shift 2 ;;
        -a|--daemon-arg) need_arg $# "$1"; daemon_args+=("$2"); shift 2 ;;
        --cache) need_arg $# "$1"; cache=$2; shift 2 ;;
        -o|--mount-opts) need_arg $# "$1"; mountopts=$2; shift 2 ;;
        --file-size) need_arg $# "$1"; fsize=$2; shift 2 ;;
        --runtime) need_arg $# "$1"; runtime=$2; shift 2 ;;
        --bs) need_arg $# "$1"; bs=$2; shift 2 ;;
        --cpus) need_arg $# "$1"; cpus=$2; shift 2 ;;
        --mem) need_arg $# "$1"; mem=$2; shift 2 ;;
        --queues) need_arg $# "$1"; queues=$2; shift 2 ;;
        --log) need_arg $# "$1"; logfile=$2; shift 2 ;;
        --kernel) need_arg $# "$1"; kernel=$2; shift 2 ;;
        --marks) marks=1; shift ;;
        -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option '$1' (see the header of $0)" ;;
        *) jobs+=("$1"); shift ;;
    esac
done
[[ -n $out ]] || die "missing --out DIR"
((${#jobs[@]})) || die "no fio job given (NAME:RW:ENGINE[:IODEPTH[:NUMJOBS]])"
[[ $runtime =~ ^[1-9][0-9]*$ ]] || die "--runtime must be whole seconds, got '$runtime'"
[[ $fsize =~ ^[1-9][0-9]*[KMG]$ ]] || die "--file-size must look like 64M or 1G, got '$fsize'"
need_cmd python3

maxjobs=1
for j in "${jobs[@]}"; do
    IFS=: read -r name rw engine depth numjobs jsize nrfiles where <<<"$j"
    [[ $name =~ ^[A-Za-z0-9_.-]+$ && -n $rw && -n $engine ]] || die "bad job '$j' (NAME:RW:ENGINE[:IODEPTH[:NUMJOBS[:SIZE[:NRFILES[:WHERE]]]]])"
    [[ -z ${jsize:-} || $jsize =~ ^[1-9][0-9]*[KMG]$ ]] || die "job '$j': SIZE must look like 64K or 32M"
    [[ -z ${nrfiles:-} || $nrfiles =~ ^[1-9][0-9]*$ ]] || die "job '$j': NRFILES must be a number"
    [[ -z ${where:-} || $where == share || $where == tmpfs ]] || die "job '$j': WHERE must be share or tmpfs"
    numjobs=${numjobs:-1}
    [[ -n ${jsize:-} ]] && continue  # own files, made below
    ((numjobs > maxjobs)) && maxjobs=$numjobs
done

mkdir -p "$out"
share=$(mktemp -d "${TMPDIR:-/tmp}/daxfsd-fio.XXXXXX")
trap 'rm -rf -- "$share"' EXIT
log "making $maxjobs data file(s) of $fsize in $share"
for ((i = 0; i < maxjobs; i++)); do
    head -c "$fsize" /dev/urandom >"$share/data.$i"
done
mkdir "$share/.results"
# Jobs with their own SIZE: NUMJOBS x NRFILES files named as fio names them
# (JOB.JOBNUM.FILENUM) in the share's directory JOB.d (tmpfs jobs: fio lays them out).
for j in "${jobs[@]}"; do
    IFS=: read -r name rw engine depth numjobs jsize nrfiles where <<<"$j"
    [[ -n ${jsize:-} && ${where:-share} == share ]] || continue
    log "making ${numjobs:-1} x ${nrfiles:-1} file(s) of $jsize for job $name"
    python3 - "$share/$name.d" "$name" "${numjobs:-1}" "${nrfiles:-1}" "$jsize" <<'PY'
import os, sys
d, name, nj, nf, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
n = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[size[-1].upper()]
os.makedirs(d)
for j in range(nj):
    for f in range(nf):
        with open(os.path.join(d, f"{name}.{j}.{f}"), "wb") as out:
            left = n
            while left:
                chunk = os.urandom(min(left, 1 << 20))
                out.write(chunk)
                left -= len(chunk)
PY
done

# The guest program: every job in turn, JSON results onto the share.
gscript="$share/.run.sh"
{
    echo 'set -u'
    echo 'rc=0'
    for j in "${jobs[@]}"; do
        IFS=: read -r name rw engine depth numjobs jsize nrfiles where <<<"$j"
        depth=${depth:-1} numjobs=${numjobs:-1} nrfiles=${nrfiles:-1} where=${where:-share}
        files="/mnt/data.0"
        jobsize=$fsize
        if [[ -n ${jsize:-} ]]; then
            dir=/mnt/$name.d
            if [[ $where == tmpfs ]]; then
                dir=/tmp/fio-tmpfs/$name.d
                echo "mkdir -p /tmp/fio-tmpfs && { grep -q ' /tmp/fio-tmpfs ' /proc/mounts || mount -t tmpfs -o size=512m tmpfs /tmp/fio-tmpfs; } && mkdir -p $dir"
            fi
            # fio's --size is per job: all of its NRFILES files.
            n=${jsize%?} u=${jsize: -1}
            jobsize=$((n * nrfiles))$u
            fileopt="--directory=$dir --nrfiles=$nrfiles --filesize=$jsize --file_service_type=random"
        elif ((numjobs > 1)); then
            files=""
            for ((i = 0; i < numjobs; i++)); do files+="${files:+:}/mnt/data.$i"; done
            # One file per job: fio's filename_format picks data.<jobnum>.
            fileopt="--filename_format='/mnt/data.\$jobnum' --nrfiles=1"
        else
            fileopt="--filename=$files"
        fi
        echo "echo \"fio-vm: $name\""
        if ((marks)); then echo ": >/mnt/.results/$name.t0"; fi
        echo "fio --name=$name $fileopt --rw=$rw --ioengine=$engine --iodepth=$depth --numjobs=$numjobs --group_reporting --bs=$bs --size=$jobsize --runtime=$runtime --time_based --output-format=json --output=/mnt/.results/$name.json >/mnt/.results/$name.err 2>&1 || { echo \"fio-vm: $name failed\"; tail -n 5 /mnt/.results/$name.err; rc=1; }"
        if ((marks)); then echo ": >/mnt/.results/$name.t1"; fi
        # The patched guest kernel's window counters (since boot), into guest-output.txt.
        echo "[ -r /sys/module/fuse/parameters/dax_stats ] && echo \"dax_stats $name: \$(cat /sys/module/fuse/parameters/dax_stats)\""
    done
    # shellcheck disable=SC2016 # $rc is the guest script's, expanded there
    echo 'exit $rc'
} >"$gscript"

vm_args=(-p "$profile" -d "$daemon" --cache "$cache" -s "$share" --script "$gscript"
    --cpus "$cpus" -m "$mem" --queues "$queues" -T $((120 + ${#jobs[@]} * (runtime + 60))))
[[ -n $mountopts ]] && vm_args+=(-o "$mountopts")
[[ -n $logfile ]] && vm_args+=(-l "$logfile")
[[ -n $kernel ]] && vm_args+=(--kernel "$kernel")
for a in "${daemon_args[@]}"; do vm_args+=(-a "$a"); done
vm_rc=0
"$RIG_ROOT/scripts/vm.sh" "${vm_args[@]}" >"$out/guest-output.txt" || vm_rc=$?
for j in "${jobs[@]}"; do
    name=${j%%:*}
    [[ -s $share/.results/$name.json ]] && cp -- "$share/.results/$name.json" "$out/$name.json"
    [[ -s $share/.results/$name.err ]] && cp -- "$share/.results/$name.err" "$out/$name.err"
    if ((marks)) && [[ -e $share/.results/$name.t0 && -e $share/.results/$name.t1 ]]; then
        stat -c '%.9Y' -- "$share/.results/$name.t0" "$share/.results/$name.t1" | paste -sd' ' >"$out/$name.marks"
    fi
done
# One line per job: NAME MiB/s IOPS (or NAME failed).
python3 - "$out" "${jobs[@]}" <<'PY'
import json, sys, os
out = sys.argv[1]
for spec in sys.argv[2:]:
    name = spec.split(":")[0]
    path = os.path.join(out, name + ".json")
    try:
        text = open(path).read()
        data = json.loads(text[text.index("{"):])
        job = data["jobs"][0]
        side = "write" if job["write"]["bw"] > job["read"]["bw"] else "read"
        bw = job[side]["bw"] / 1024.0
        print(f"{name} {bw:.1f} {job[side]['iops']:.0f}")
    except (OSError, ValueError, KeyError, IndexError):
        print(f"{name} failed")
PY
exit "$vm_rc"
