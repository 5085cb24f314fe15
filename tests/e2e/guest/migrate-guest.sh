# shellcheck shell=sh disable=SC2016 # sh -c bodies expand in the guest
# Guest side of tests/e2e/migrate.sh (busybox sh, run in /mnt by the test init, after the
# guest helpers of tests/e2e/guest/lib.sh: check, bad, guest_end).
# Holds a working directory and open files on the share, says MIGRATE-READY, waits
# for the host's marker file ../migrated (written once the VM runs where it should), then
# checks that what it held still works and that new work does.
mkdir -p work && cd work || exit 125
echo "written before migration" >held
exec 3<held
exec 4>>appended
echo line1 >&4
echo "MIGRATE-READY"
i=0
# Poll the share itself: requests keep flowing while the VM is stopped and moved.
while [ ! -e ../migrated ]; do
    sleep 0.2
    i=$((i + 1))
    [ $i -lt 6000 ] || { bad marker "no ../migrated after 20 min"; guest_end; }
done
echo "MIGRATE-RESUMED on $(cat ../migrated)"
read_fd3() { read -r l <&3 && [ "$l" = "written before migration" ]; }
check fd_opened_before_reads read_fd3
check cwd_lists sh -c 'ls . | grep -qx held'
check stat_held test -f held
check create_write sh -c 'echo "made after migration" >created && [ "$(cat created)" = "made after migration" ]'
append_fd4() { echo line2 >&4 && [ "$(tr '\n' ' ' <appended)" = "line1 line2 " ]; }
check append_fd_opened_before append_fd4
check mkdir_in_cwd sh -c 'mkdir sub && echo x >sub/f && [ "$(ls sub)" = f ]'
check rename sh -c 'mv created renamed && [ -f renamed ] && [ ! -e created ]'
exec 3<&- 4>&-
guest_end
