/*
 * vfstest: guest-side checks of a virtio-fs mount that busybox cannot do.
 * Built with `gcc -static` into the test initramfs.
 *
 *   vfstest CHECK ARGS...
 *
 * Each check exits 0 when every assertion held, 1 otherwise, printing the
 * first failed assertion ("vfstest: CHECK: what: detail") on stderr.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FUSE_SUPER_MAGIC 0x65735546
#define MiB (1024LL * 1024)

static const char *check_name = "?";
/* A child a check started and must not leave behind when an assertion fails. */
static pid_t held_child;

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    int e = errno;
    fprintf(stderr, "vfstest: %s: ", check_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (errno %d: %s)\n", e, strerror(e));
    if (held_child > 0)
        kill(held_child, SIGKILL);
    exit(1);
}

#define ASSERT(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)
/* Call that must succeed (return >= 0). */
#define OK(call) ({ errno = 0; __typeof__(call) r_ = (call); ASSERT(r_ >= 0, "%s failed", #call); r_; })
/* Call that must fail with errno E. */
#define FAILS(call, E) do { errno = 0; long r_ = (long)(call); \
        ASSERT(r_ == -1 && errno == (E), "%s: expected %s, got %ld", #call, #E, r_); } while (0)

static void fill(char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)((i * 2654435761u + seed) >> 13);
}

/* dst = a + "/" + b; fails on overflow. */
static char *join(char dst[4096], const char *a, const char *b)
{
    int n = snprintf(dst, 4096, "%s/%s", a, b);
    ASSERT(n > 0 && n < 4096, "path too long: %s/%s", a, b);
    return dst;
}

static void write_all(int fd, const void *buf, size_t len, off_t off)
{
    ssize_t n = pwrite(fd, buf, len, off);
    ASSERT(n == (ssize_t)len, "pwrite %zu bytes at %lld returned %zd", len, (long long)off, n);
}

static void read_exact(int fd, void *buf, size_t len, off_t off)
{
    ssize_t n = pread(fd, buf, len, off);
    ASSERT(n == (ssize_t)len, "pread %zu bytes at %lld returned %zd", len, (long long)off, n);
}

static int wait_child(pid_t pid)
{
    int st;
    OK(waitpid(pid, &st, 0));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- locks: fcntl (POSIX) and flock between processes ---------------- */
static int cmd_locks(const char *path)
{
    signal(SIGPIPE, SIG_IGN); /* a dead child must give EPIPE, not kill us */
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    OK(ftruncate(fd, 4096));

    struct flock wl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 100 };
    OK(fcntl(fd, F_SETLK, &wl));

    int ready[2], go[2];
    OK(pipe(ready));
    OK(pipe(go));
    pid_t parent = getpid();
    pid_t pid = OK(fork());
    if (pid == 0) {
        check_name = "locks(child)";
        close(ready[0]);
        close(go[1]);
        int cfd = OK(open(path, O_RDWR));
        struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 50, .l_len = 10 };
        FAILS(fcntl(cfd, F_SETLK, &l), EAGAIN);
        struct flock q = l;
        OK(fcntl(cfd, F_GETLK, &q));
        ASSERT(q.l_type == F_WRLCK, "F_GETLK: l_type %d, expected F_WRLCK", q.l_type);
        ASSERT(q.l_pid == parent, "F_GETLK: l_pid %d, expected %d", q.l_pid, parent);
        ASSERT(q.l_start == 0 && q.l_len == 100, "F_GETLK: range %lld+%lld", (long long)q.l_start, (long long)q.l_len);
        /* A range outside the parent's lock is free. */
        struct flock free_l = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 200, .l_len = 10 };
        OK(fcntl(cfd, F_SETLK, &free_l));
        /* flock: parent holds LOCK_EX on its own open file description. */
        int ffd = OK(open(path, O_RDONLY));
        char c = 'r';
        OK(write(ready[1], &c, 1));
        ASSERT(read(go[0], &c, 1) == 1, "parent went away");
        FAILS(flock(ffd, LOCK_SH | LOCK_NB), EWOULDBLOCK);
        OK(write(ready[1], &c, 1));
        /* Blocking F_SETLKW must succeed once the parent unlocks. */
        ASSERT(read(go[0], &c, 1) == 1, "parent went away");
        OK(fcntl(cfd, F_SETLKW, &l));
        OK(flock(ffd, LOCK_SH | LOCK_NB));
        _exit(0);
    }
    /* Only the child writes "ready": its exit gives EOF instead of a hang. */
    close(ready[1]);
    close(go[0]);
    char c;
    if (read(ready[0], &c, 1) != 1)
        fail("child exited early with status %d", wait_child(pid));
    int ffd = OK(open(path, O_RDONLY));
    OK(flock(ffd, LOCK_EX | LOCK_NB));
    OK(write(go[1], &c, 1));
    if (read(ready[0], &c, 1) != 1)
        fail("child exited early with status %d", wait_child(pid));
    /* Release both; the child waits in F_SETLKW. */
    struct flock ul = { .l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    OK(fcntl(fd, F_SETLK, &ul));
    OK(flock(ffd, LOCK_UN));
    OK(write(go[1], &c, 1));
    int rc = wait_child(pid);
    ASSERT(rc == 0, "child failed with status %d", rc);
    /* Shared flocks coexist; upgrading while another holds LOCK_SH fails. */
    int a = OK(open(path, O_RDONLY)), b = OK(open(path, O_RDONLY));
    OK(flock(a, LOCK_SH | LOCK_NB));
    OK(flock(b, LOCK_SH | LOCK_NB));
    FAILS(flock(a, LOCK_EX | LOCK_NB), EWOULDBLOCK);
    close(a); close(b); close(ffd); close(fd);
    return 0;
}

/* ---- mmap MAP_SHARED read/write coherence ------------------------------ */
static int cmd_mmap(const char *path)
{
    const size_t len = 256 * 1024;
    char *want = malloc(len), *got = malloc(len);
    ASSERT(want && got, "malloc");
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    OK(ftruncate(fd, (off_t)len));
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED, "mmap MAP_SHARED rw");
    for (size_t i = 0; i < len; i++)
        ASSERT(m[i] == 0, "fresh mapping not zero at %zu", i);
    fill(want, len, 7);
    memcpy(m, want, len);
    OK(msync(m, len, MS_SYNC));
    /* Visible through read() on another descriptor. */
    int fd2 = OK(open(path, O_RDONLY));
    read_exact(fd2, got, len, 0);
    ASSERT(memcmp(got, want, len) == 0, "read() does not see mmap writes");
    /* write() is visible through the mapping. */
    fill(want + 4096, 8192, 99);
    write_all(fd, want + 4096, 8192, 4096);
    ASSERT(memcmp(m, want, len) == 0, "mapping does not see write()");
    OK(munmap(m, len));
    /* A MAP_PRIVATE write must not reach the file. */
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd2, 0);
    ASSERT(p != MAP_FAILED, "mmap MAP_PRIVATE");
    memset(p, 'X', 4096);
    OK(munmap(p, len));
    read_exact(fd2, got, len, 0);
    ASSERT(memcmp(got, want, len) == 0, "MAP_PRIVATE write leaked into the file");
    /* Second shared mapping at an offset, after close of the writer. */
    close(fd);
    char *m2 = mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd2, 65536);
    ASSERT(m2 != MAP_FAILED, "mmap MAP_SHARED ro at offset");
    ASSERT(memcmp(m2, want + 65536, 65536) == 0, "read-only mapping at offset differs");
    OK(munmap(m2, 65536));
    close(fd2);
    free(want); free(got);
    return 0;
}

/* ---- xattrs ------------------------------------------------------------ */
static int cmd_xattr(const char *path, const char *mode)
{
    int fd = OK(open(path, O_RDWR | O_CREAT, 0644));
    close(fd);
    if (strcmp(mode, "off") == 0) {
        FAILS(setxattr(path, "user.daxfsd", "v", 1, 0), EOPNOTSUPP);
        return 0;
    }
    char buf[256];
    FAILS(getxattr(path, "user.daxfsd", buf, sizeof buf), ENODATA);
    FAILS(setxattr(path, "user.daxfsd", "x", 1, XATTR_REPLACE), ENODATA);
    OK(setxattr(path, "user.daxfsd", "value", 5, XATTR_CREATE));
    FAILS(setxattr(path, "user.daxfsd", "again", 5, XATTR_CREATE), EEXIST);
    ssize_t n = OK(getxattr(path, "user.daxfsd", NULL, 0));
    ASSERT(n == 5, "size query returned %zd, expected 5", n);
    FAILS(getxattr(path, "user.daxfsd", buf, 2), ERANGE);
    n = OK(getxattr(path, "user.daxfsd", buf, sizeof buf));
    ASSERT(n == 5 && memcmp(buf, "value", 5) == 0, "getxattr returned %zd '%.*s'", n, (int)n, buf);
    OK(setxattr(path, "user.other", "", 0, 0));
    OK(setxattr(path, "user.gone", "bye", 3, 0));
    n = OK(listxattr(path, buf, sizeof buf));
    int seen = 0;
    for (char *s = buf; s < buf + n; s += strlen(s) + 1) {
        if (!strcmp(s, "user.daxfsd")) seen |= 1;
        if (!strcmp(s, "user.other")) seen |= 2;
        if (!strcmp(s, "user.gone")) seen |= 4;
    }
    ASSERT(seen == 7, "listxattr missed names (mask %d)", seen);
    n = OK(getxattr(path, "user.other", buf, sizeof buf));
    ASSERT(n == 0, "empty value has size %zd", n);
    OK(removexattr(path, "user.gone"));
    FAILS(removexattr(path, "user.gone"), ENODATA);
    /* A 1 KiB binary value round-trips through fsetxattr/fgetxattr. */
    char big[1024], big2[1024];
    fill(big, sizeof big, 3);
    fd = OK(open(path, O_RDONLY));
    OK(fsetxattr(fd, "user.big", big, sizeof big, 0));
    n = OK(fgetxattr(fd, "user.big", big2, sizeof big2));
    ASSERT(n == (ssize_t)sizeof big && !memcmp(big, big2, sizeof big), "1 KiB value differs");
    close(fd);
    /* xattrs on a directory too. */
    char dir[4096];
    ASSERT(snprintf(dir, sizeof dir, "%s.d", path) < (int)sizeof dir, "path too long");
    OK(mkdir(dir, 0755));
    OK(setxattr(dir, "user.dir", "d", 1, 0));
    n = OK(getxattr(dir, "user.dir", buf, sizeof buf));
    ASSERT(n == 1 && buf[0] == 'd', "directory xattr");
    return 0;
}

/* ---- statfs --------------------------------------------------------------- */
static int cmd_statfs(const char *dir, const char *out)
{
    struct statfs s;
    OK(statfs(dir, &s));
    ASSERT(s.f_type == FUSE_SUPER_MAGIC, "f_type 0x%lx, expected FUSE 0x%x", (long)s.f_type, FUSE_SUPER_MAGIC);
    ASSERT(s.f_bsize > 0 && s.f_frsize > 0, "zero block size");
    ASSERT(s.f_blocks > 0, "f_blocks is 0");
    ASSERT(s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree, "free > total");
    ASSERT(s.f_namelen >= 255, "f_namelen %ld", (long)s.f_namelen);
    struct statfs s2;
    int fd = OK(open(dir, O_RDONLY | O_DIRECTORY));
    OK(fstatfs(fd, &s2));
    ASSERT(s2.f_blocks == s.f_blocks && s2.f_frsize == s.f_frsize, "fstatfs differs from statfs");
    close(fd);
    FILE *f = fopen(out, "w");
    ASSERT(f, "fopen %s", out);
    fprintf(f, "frsize=%ld blocks=%llu files=%llu namelen=%ld\n", (long)s.f_frsize,
            (unsigned long long)s.f_blocks, (unsigned long long)s.f_files, (long)s.f_namelen);
    ASSERT(fclose(f) == 0, "fclose");
    return 0;
}

/* ---- unlink of an open file ------------------------------------------- */
static int cmd_unlinkopen(const char *dir)
{
    char path[4096];
    join(path, dir, "open-unlinked");
    const size_t len = 1 * MiB;
    char *want = malloc(len), *got = malloc(len);
    ASSERT(want && got, "malloc");
    fill(want, len, 11);
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    write_all(fd, want, len, 0);
    int rfd = OK(open(path, O_RDONLY));
    OK(unlink(path));
    struct stat st;
    FAILS(stat(path, &st), ENOENT);
    OK(fstat(fd, &st));
    ASSERT(st.st_nlink == 0, "st_nlink %lu after unlink", (unsigned long)st.st_nlink);
    ASSERT(st.st_size == (off_t)len, "size %lld after unlink", (long long)st.st_size);
    read_exact(rfd, got, len, 0);
    ASSERT(!memcmp(got, want, len), "data differs after unlink");
    /* Still writable and extendable. */
    write_all(fd, "tail", 4, (off_t)len);
    read_exact(rfd, got, 4, (off_t)len);
    ASSERT(!memcmp(got, "tail", 4), "write after unlink not visible");
    OK(ftruncate(fd, 4096));
    OK(fstat(rfd, &st));
    ASSERT(st.st_size == 4096, "ftruncate after unlink: size %lld", (long long)st.st_size);
    /* A new file with the same name is independent. */
    int nfd = OK(open(path, O_RDWR | O_CREAT | O_EXCL, 0644));
    write_all(nfd, "new", 3, 0);
    read_exact(rfd, got, 3, 0);
    ASSERT(!memcmp(got, want, 3), "old descriptor sees the new file");
    close(nfd);
    OK(unlink(path));
    /* Still readable after the name is reused and removed again. */
    read_exact(rfd, got, 4096, 0);
    ASSERT(!memcmp(got, want, 4096), "data lost after second unlink");
    close(fd); close(rfd);
    /* An unlinked directory: rmdir while open, then getdents is empty. */
    char d[4096];
    join(d, dir, "open-rmdir");
    OK(mkdir(d, 0755));
    int dfd = OK(open(d, O_RDONLY | O_DIRECTORY));
    OK(rmdir(d));
    OK(fstat(dfd, &st));
    ASSERT(S_ISDIR(st.st_mode), "fstat of removed dir");
    FAILS(openat(dfd, "x", O_CREAT | O_RDWR, 0644), ENOENT);
    close(dfd);
    free(want); free(got);
    return 0;
}

/* ---- large sparse file ----------------------------------------------------- */
static int cmd_sparse(const char *path)
{
    const off_t marks[] = { 1 * MiB, 300 * MiB, 5LL * 1024 * MiB };
    const char *tags[] = { "HEAD", "MIDL", "TAIL" };
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    for (int i = 0; i < 3; i++)
        write_all(fd, tags[i], 4, marks[i]);
    struct stat st;
    OK(fstat(fd, &st));
    ASSERT(st.st_size == marks[2] + 4, "size %lld, expected %lld", (long long)st.st_size, (long long)(marks[2] + 4));
    ASSERT(st.st_blocks * 512 < 16 * MiB, "not sparse: %lld blocks allocated", (long long)st.st_blocks);
    char buf[4096], zero[4096] = { 0 };
    for (int i = 0; i < 3; i++) {
        read_exact(fd, buf, 4, marks[i]);
        ASSERT(!memcmp(buf, tags[i], 4), "tag %s lost", tags[i]);
    }
    read_exact(fd, buf, sizeof buf, 2LL * 1024 * MiB);
    ASSERT(!memcmp(buf, zero, sizeof buf), "hole at 2 GiB is not zero");
    off_t end = OK(lseek(fd, 0, SEEK_END));
    ASSERT(end == marks[2] + 4, "SEEK_END %lld", (long long)end);
    off_t pos = OK(lseek(fd, -4, SEEK_END));
    ssize_t n = read(fd, buf, 100);
    ASSERT(n == 4 && !memcmp(buf, "TAIL", 4), "read at SEEK_END-4 (pos %lld) got %zd", (long long)pos, n);
    n = read(fd, buf, 100);
    ASSERT(n == 0, "read at EOF returned %zd", n);
    /* Reopen and shrink to below 4 GiB, grow again. */
    close(fd);
    fd = OK(open(path, O_RDWR));
    OK(ftruncate(fd, 300 * MiB + 4));
    OK(fstat(fd, &st));
    ASSERT(st.st_size == 300 * MiB + 4, "size after shrink %lld", (long long)st.st_size);
    read_exact(fd, buf, 4, 300 * MiB);
    ASSERT(!memcmp(buf, "MIDL", 4), "MIDL lost by shrink");
    close(fd);
    return 0;
}

/* SEEK_DATA / SEEK_HOLE report the holes of the file written by `sparse`. */
static int cmd_seekdata(const char *path)
{
    int fd = OK(open(path, O_RDONLY));
    off_t d = OK(lseek(fd, 0, SEEK_DATA));
    ASSERT(d == 1 * MiB, "SEEK_DATA from 0 = %lld, expected %lld", (long long)d, 1 * MiB);
    off_t h = OK(lseek(fd, 1 * MiB, SEEK_HOLE));
    ASSERT(h > 1 * MiB && h <= 2 * MiB, "SEEK_HOLE from 1 MiB = %lld", (long long)h);
    d = OK(lseek(fd, h, SEEK_DATA));
    ASSERT(d == 300 * MiB, "second SEEK_DATA = %lld, expected %lld", (long long)d, 300 * MiB);
    h = OK(lseek(fd, 300 * MiB, SEEK_HOLE));
    ASSERT(h == 300 * MiB + 4, "SEEK_HOLE at the end = %lld", (long long)h);
    FAILS(lseek(fd, 300 * MiB + 4, SEEK_DATA), ENXIO);
    close(fd);
    return 0;
}

/* ---- timestamps with nanoseconds -------------------------------------- */
static int cmd_utimes(const char *path)
{
    int fd = OK(open(path, O_RDWR | O_CREAT, 0644));
    close(fd);
    struct timespec ts[2] = { { 1000000000, 123456789 }, { 1234567890, 987654321 } };
    OK(utimensat(AT_FDCWD, path, ts, 0));
    struct stat st;
    OK(stat(path, &st));
    ASSERT(st.st_atim.tv_sec == ts[0].tv_sec && st.st_atim.tv_nsec == ts[0].tv_nsec,
           "atime %lld.%09ld", (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec);
    ASSERT(st.st_mtim.tv_sec == ts[1].tv_sec && st.st_mtim.tv_nsec == ts[1].tv_nsec,
           "mtime %lld.%09ld", (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    /* UTIME_OMIT keeps mtime; UTIME_NOW moves atime to "now" (the host's
     * clock or the guest's: either is far past the fixed stamp). */
    struct timespec now_omit[2] = { { 0, UTIME_NOW }, { 0, UTIME_OMIT } };
    OK(utimensat(AT_FDCWD, path, now_omit, 0));
    OK(stat(path, &st));
    ASSERT(st.st_mtim.tv_sec == ts[1].tv_sec && st.st_mtim.tv_nsec == ts[1].tv_nsec, "UTIME_OMIT changed mtime");
    ASSERT(st.st_atim.tv_sec > ts[1].tv_sec, "UTIME_NOW left atime at %lld", (long long)st.st_atim.tv_sec);
    /* A write moves mtime forward. */
    fd = OK(open(path, O_WRONLY));
    write_all(fd, "x", 1, 0);
    close(fd);
    OK(stat(path, &st));
    ASSERT(st.st_mtim.tv_sec > ts[1].tv_sec, "write did not update mtime (%lld)", (long long)st.st_mtim.tv_sec);
    /* Restore the fixed times for the host-side check. */
    OK(utimensat(AT_FDCWD, path, ts, 0));
    return 0;
}

/* ---- timestamps across the range the protocol carries ------------------
 * `timeedges DIR set` gives each file DIR/eN its own atime/mtime pair, then
 * `timeedges DIR check` (after drop_caches) reads them back. The first pairs
 * lie inside the range of every file system with 64-bit times (ext4 with
 * large inodes, xfs bigtime, btrfs, tmpfs): they must come back exactly, and
 * tests/e2e/host-check.sh reads the same files on the host. The last pairs lie
 * outside any file system's range: the host clamps them, so they must come
 * back on the same side of 1970 and at least as far out as 32-bit time_t. */
struct time_edge { struct timespec at, mt; int exact; };
static const struct time_edge time_edges[] = {
    { { -315619200, 0 }, { -1, 999999999 }, 1 },             /* 1960-01-01; -1 s */
    { { INT32_MIN, 0 }, { INT32_MIN + 1LL, 1 }, 1 },           /* 1901-12-13 20:45:52, and 1 s later */
    { { 4102444800LL, 999999999 }, { 2147483648LL, 0 }, 1 }, /* 2100; 2038-01-19 03:14:08 */
    { { 0, 0 }, { INT32_MAX, 999999999 }, 1 },
    { { INT64_MIN, 0 }, { INT64_MAX, 999999999 }, 0 },       /* clamped by the host */
    { { INT64_MAX, 0 }, { INT64_MIN, 0 }, 0 },
};

static void check_time(const char *what, const char *path, struct timespec got, struct timespec want, int exact)
{
    if (exact) {
        ASSERT(got.tv_sec == want.tv_sec && got.tv_nsec == want.tv_nsec, "%s %s: %lld.%09ld, expected %lld.%09ld",
               path, what, (long long)got.tv_sec, got.tv_nsec, (long long)want.tv_sec, want.tv_nsec);
    } else if (want.tv_sec < 0) {
        ASSERT(got.tv_sec <= INT32_MIN, "%s %s: %lld, expected a time at or before 1901-12-13",
               path, what, (long long)got.tv_sec);
    } else {
        ASSERT(got.tv_sec >= INT32_MAX, "%s %s: %lld, expected a time at or after 2038-01-19",
               path, what, (long long)got.tv_sec);
    }
}

static int cmd_timeedges(const char *dir, const char *mode)
{
    int set = !strcmp(mode, "set");
    ASSERT(set || !strcmp(mode, "check"), "mode %s", mode);
    for (size_t i = 0; i < sizeof time_edges / sizeof time_edges[0]; i++) {
        const struct time_edge *e = &time_edges[i];
        char path[4096], name[16];
        snprintf(name, sizeof name, "e%zu", i);
        join(path, dir, name);
        if (set) {
            close(OK(open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)));
            struct timespec ts[2] = { e->at, e->mt };
            OK(utimensat(AT_FDCWD, path, ts, 0));
        }
        struct stat st;
        OK(stat(path, &st));
        check_time("atime", path, st.st_atim, e->at, e->exact);
        check_time("mtime", path, st.st_mtim, e->mt, e->exact);
        if (set) {
            /* Through a descriptor (SETATTR with a handle) the same. */
            int fd = OK(open(path, O_WRONLY));
            struct timespec ts[2] = { e->at, e->mt };
            OK(futimens(fd, ts));
            OK(fstat(fd, &st));
            close(fd);
            check_time("atime after futimens", path, st.st_atim, e->at, e->exact);
            check_time("mtime after futimens", path, st.st_mtim, e->mt, e->exact);
        }
    }
    if (set) {
        char path[4096];
        join(path, dir, "e0");
        /* No time has 10^9 nanoseconds: EINVAL, in the guest's VFS already. */
        struct timespec bad[2] = { { 5, 1000000000 }, { 5, 0 } };
        FAILS(utimensat(AT_FDCWD, path, bad, 0), EINVAL);
    }
    return 0;
}

/* ---- lseek: every whence at and around the ends of a file --------------- */
static void seek_is(int fd, off_t off, int whence, off_t want, int err)
{
    errno = 0;
    off_t got = lseek(fd, off, whence);
    if (err)
        ASSERT(got == -1 && errno == err, "lseek(%lld, %d) = %lld, expected errno %d",
               (long long)off, whence, (long long)got, err);
    else
        ASSERT(got == want, "lseek(%lld, %d) = %lld, expected %lld",
               (long long)off, whence, (long long)got, (long long)want);
}

static int cmd_seekedges(const char *path)
{
    const off_t size = 1 * MiB + 100;
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    char buf[4096];
    memset(buf, 'd', sizeof buf);
    write_all(fd, buf, sizeof buf, 0);
    write_all(fd, buf, 100, 1 * MiB);
    OK(fsync(fd));
    /* lseek(2): SEEK_DATA/SEEK_HOLE at or past the end, or before the start: ENXIO. */
    const off_t outside[] = { size, size + 1, 1LL << 40, INT64_MAX, -1, -size, INT64_MIN };
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        seek_is(fd, outside[i], SEEK_DATA, 0, ENXIO);
        seek_is(fd, outside[i], SEEK_HOLE, 0, ENXIO);
    }
    seek_is(fd, 0, SEEK_DATA, 0, 0);
    seek_is(fd, size - 1, SEEK_DATA, size - 1, 0);
    seek_is(fd, size - 1, SEEK_HOLE, size, 0);
    /* Negative results: EINVAL; the position is left alone. */
    seek_is(fd, 7, SEEK_SET, 7, 0);
    seek_is(fd, -1, SEEK_SET, 0, EINVAL);
    seek_is(fd, -8, SEEK_CUR, 0, EINVAL);
    seek_is(fd, -size - 1, SEEK_END, 0, EINVAL);
    seek_is(fd, 0, SEEK_CUR, 7, 0);
    seek_is(fd, 3, SEEK_CUR, 10, 0);
    seek_is(fd, -1, SEEK_END, size - 1, 0);
    seek_is(fd, 0, 5, 0, EINVAL);
    seek_is(fd, 0, 99, 0, EINVAL);
    close(fd);
    /* An empty file has neither data nor a hole at 0. */
    fd = OK(open(path, O_RDWR | O_TRUNC));
    seek_is(fd, 0, SEEK_DATA, 0, ENXIO);
    seek_is(fd, 0, SEEK_HOLE, 0, ENXIO);
    seek_is(fd, -1, SEEK_HOLE, 0, ENXIO);
    seek_is(fd, 0, SEEK_END, 0, 0);
    close(fd);
    return 0;
}

/* ---- mtime/ctime after stores through a shared mapping, and write(2) ----
 * As on a local file system: a store through a MAP_SHARED mapping moves mtime
 * and ctime by the next msync, fsync or munmap at the latest, and write(2)
 * moves them at once. Each round sets a fixed old mtime, waits past any
 * timestamp granularity, stores, syncs, and wants both times moved; then waits
 * past the attribute timeout of `--cache auto` and wants them still moved (the
 * host file has them, not only the guest's cache). On a DAX mount every store
 * goes straight into the host file through the window. */
static void mtime_round_start(const char *path, struct stat *before)
{
    struct timespec old[2] = { { 1000000000, 0 }, { 1000000000, 0 } };
    OK(utimensat(AT_FDCWD, path, old, 0));
    OK(stat(path, before));
    usleep(1100 * 1000);
    /* Fetch the attributes again now, as the lookup of an open() would: the store and
     * the check that follow run within the guest's attribute timeout. */
    struct stat st;
    OK(stat(path, &st));
    ASSERT(st.st_mtim.tv_sec == before->st_mtim.tv_sec, "mtime moved before the store");
}

static void mtime_moved(const char *what, const char *path, const struct stat *before)
{
    struct stat st;
    for (int pass = 0; pass < 2; pass++) {
        OK(stat(path, &st));
        ASSERT(st.st_mtim.tv_sec > before->st_mtim.tv_sec,
               "%s%s: mtime %lld.%09ld, before the store %lld.%09ld", what,
               pass ? " (after the attribute timeout)" : "",
               (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
               (long long)before->st_mtim.tv_sec, before->st_mtim.tv_nsec);
        ASSERT(st.st_ctim.tv_sec > before->st_ctim.tv_sec ||
               (st.st_ctim.tv_sec == before->st_ctim.tv_sec && st.st_ctim.tv_nsec > before->st_ctim.tv_nsec),
               "%s%s: ctime %lld.%09ld, before the store %lld.%09ld", what,
               pass ? " (after the attribute timeout)" : "",
               (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec,
               (long long)before->st_ctim.tv_sec, before->st_ctim.tv_nsec);
        if (!pass)
            usleep(1100 * 1000);
    }
}

static int cmd_mmapmtime(const char *path, const char *size_s)
{
    const size_t len = size_s ? strtoul(size_s, NULL, 0) : 64 * 1024;
    ASSERT(len >= 200, "size %zu: at least 200 bytes", len);
    char buf[4096];
    struct stat before;
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    fill(buf, sizeof buf, 3);
    for (size_t off = 0; off < len; off += sizeof buf)
        write_all(fd, buf, len - off < sizeof buf ? len - off : sizeof buf, off);
    OK(fsync(fd));

    /* msync(MS_SYNC) after a read fault then a store (fstests generic/080's order). */
    mtime_round_start(path, &before);
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED, "mmap");
    volatile char c = m[0];
    (void)c;
    m[1] = 'a';
    OK(msync(m, len, MS_SYNC));
    mtime_moved("store, msync", path, &before);

    /* The same mapping, a page stored to before the msync above: fsync. */
    mtime_round_start(path, &before);
    m[2] = 'b';
    OK(fsync(fd));
    mtime_moved("store again, fsync", path, &before);

    /* Another page (len >= 8 KiB), then munmap with the descriptor still open (no close, no sync). */
    mtime_round_start(path, &before);
    m[len / 2] = 'c';
    OK(munmap(m, len));
    mtime_moved("store, munmap", path, &before);

    /* A fresh mapping after close: munmap is the last reference (RELEASE, no FLUSH after). */
    mtime_round_start(path, &before);
    m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED, "mmap again");
    close(fd);
    m[len - 1] = 'd'; /* the last page: a shadow tail on DAX when len is not page-aligned */
    OK(munmap(m, len));
    mtime_moved("store after close, munmap", path, &before);

    /* write(2) inside the file (on DAX: through the window, no FUSE_WRITE): at once. */
    fd = OK(open(path, O_RDWR));
    mtime_round_start(path, &before);
    write_all(fd, "e", 1, 100);
    mtime_moved("pwrite", path, &before);
    close(fd);
    return 0;
}

/* ---- renameat2 flags and rename edge cases ----------------------------- */
static void put(const char *path, const char *s)
{
    int fd = OK(open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    write_all(fd, s, strlen(s), 0);
    close(fd);
}

static void expect_content(const char *path, const char *s)
{
    char buf[256];
    int fd = OK(open(path, O_RDONLY));
    ssize_t n = OK(read(fd, buf, sizeof buf));
    close(fd);
    ASSERT(n == (ssize_t)strlen(s) && !memcmp(buf, s, n), "%s holds '%.*s', expected '%s'", path, (int)n, buf, s);
}

static int cmd_rename2(const char *dir)
{
    char a[4096], b[4096], d1[4096], d2[4096], f[4096];
    join(a, dir, "xa");
    join(b, dir, "xb");
    put(a, "A");
    put(b, "B");
    FAILS(renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_NOREPLACE), EEXIST);
    OK(renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE));
    expect_content(a, "B");
    expect_content(b, "A");
    join(d1, dir, "xd1");
    join(d2, dir, "xd2");
    OK(mkdir(d1, 0755));
    OK(mkdir(d2, 0755));
    join(f, d2, "inner");
    put(f, "I");
    FAILS(rename(d1, d2), ENOTEMPTY);
    FAILS(rename(a, d1), EISDIR);
    FAILS(rename(d1, a), ENOTDIR);
    /* Exchange a file and a directory. */
    OK(renameat2(AT_FDCWD, a, AT_FDCWD, d2, RENAME_EXCHANGE));
    join(f, a, "inner");
    expect_content(f, "I");
    expect_content(d2, "B");
    /* A directory cannot move below itself. */
    join(f, d1, "sub");
    FAILS(rename(d1, f), EINVAL);
    return 0;
}

/* ---- readdir of many entries, with telldir/seekdir resume --------------- */
static int cmd_readdir(const char *dir, const char *count_s)
{
    int count = atoi(count_s);
    ASSERT(count > 0 && count <= 100000, "bad count %s", count_s);
    char *seen = calloc((size_t)count, 1);
    ASSERT(seen, "calloc");
    DIR *d = opendir(dir);
    ASSERT(d, "opendir %s", dir);
    struct dirent *e;
    int n = 0, dots = 0;
    long mid = -1;
    while ((errno = 0, e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) { dots++; continue; }
        int i;
        char extra;
        ASSERT(sscanf(e->d_name, "f%d%c", &i, &extra) == 1 && i >= 0 && i < count, "unexpected entry '%s'", e->d_name);
        ASSERT(!seen[i], "entry '%s' returned twice", e->d_name);
        ASSERT(e->d_type == DT_REG || e->d_type == DT_UNKNOWN, "d_type %d for '%s'", e->d_type, e->d_name);
        seen[i] = 1;
        if (++n == count / 2)
            mid = telldir(d);
    }
    ASSERT(errno == 0, "readdir");
    ASSERT(n == count, "%d entries, expected %d", n, count);
    ASSERT(dots == 2, "%d dot entries", dots);
    /* Resume in a fresh stream from the middle: exactly the rest. */
    closedir(d);
    d = opendir(dir);
    ASSERT(d, "reopen %s", dir);
    int rest = 0;
    ASSERT(mid != -1, "no telldir position");
    seekdir(d, mid);
    while ((errno = 0, e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            rest++;
    ASSERT(errno == 0, "readdir after seekdir");
    ASSERT(rest == count - count / 2, "after seekdir: %d entries, expected %d", rest, count - count / 2);
    closedir(d);
    free(seen);
    return 0;
}

/* ---- O_APPEND from two descriptors ------------------------------------- */
static int cmd_append(const char *path)
{
    int a = OK(open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644));
    int b = OK(open(path, O_WRONLY | O_APPEND));
    for (int i = 0; i < 100; i++) {
        ASSERT(write(i % 2 ? b : a, i % 2 ? "bb" : "a", i % 2 ? 2 : 1) == (i % 2 ? 2 : 1), "append write %d", i);
    }
    struct stat st;
    OK(fstat(a, &st));
    ASSERT(st.st_size == 150, "size %lld after 100 appends, expected 150", (long long)st.st_size);
    /* pwrite on O_APPEND appends on Linux, ignoring the offset. */
    ASSERT(pwrite(a, "Z", 1, 0) == 1, "pwrite O_APPEND");
    close(a); close(b);
    int r = OK(open(path, O_RDONLY));
    char buf[200];
    ssize_t n = read(r, buf, sizeof buf);
    ASSERT(n == 151, "read %zd bytes", n);
    ASSERT(buf[0] == 'a' && buf[1] == 'b' && buf[2] == 'b' && buf[3] == 'a' && buf[150] == 'Z', "append order wrong");
    close(r);
    return 0;
}

/* ---- special files: fifo and UNIX socket ------------------------------- */
static int cmd_special(const char *dir)
{
    char p[4096];
    struct stat st;
    join(p, dir, "fifo");
    OK(mkfifo(p, 0600));
    OK(lstat(p, &st));
    ASSERT(S_ISFIFO(st.st_mode), "fifo mode 0%o", st.st_mode);
    join(p, dir, "sock");
    int s = OK(socket(AF_UNIX, SOCK_STREAM, 0));
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    ASSERT(strlen(p) < sizeof sa.sun_path, "socket path too long");
    strcpy(sa.sun_path, p);
    OK(bind(s, (struct sockaddr *)&sa, sizeof sa));
    OK(listen(s, 1));
    OK(lstat(p, &st));
    ASSERT(S_ISSOCK(st.st_mode), "socket mode 0%o", st.st_mode);
    /* A client in the same guest connects through the socket file. */
    int c = OK(socket(AF_UNIX, SOCK_STREAM, 0));
    OK(connect(c, (struct sockaddr *)&sa, sizeof sa));
    int acc = OK(accept(s, NULL, NULL));
    ASSERT(write(c, "ping", 4) == 4, "socket write");
    char buf[4];
    ASSERT(read(acc, buf, 4) == 4 && !memcmp(buf, "ping", 4), "socket read");
    close(acc); close(c); close(s);
    return 0;
}

/* ---- O_DIRECT aligned I/O ------------------------------------------------ */
static int cmd_direct(const char *path)
{
    const size_t len = 1 * MiB;
    char *buf, *got;
    ASSERT(posix_memalign((void **)&buf, 4096, len) == 0 && posix_memalign((void **)&got, 4096, len) == 0, "memalign");
    fill(buf, len, 21);
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644));
    write_all(fd, buf, len, 0);
    OK(fsync(fd));
    memset(got, 0, len);
    read_exact(fd, got, len, 0);
    ASSERT(!memcmp(buf, got, len), "O_DIRECT read-back differs");
    close(fd);
    /* Buffered reader sees the direct writes. */
    fd = OK(open(path, O_RDONLY));
    read_exact(fd, got, 4096, len - 4096);
    ASSERT(!memcmp(buf + len - 4096, got, 4096), "buffered read of O_DIRECT data differs");
    close(fd);
    return 0;
}

/* Leaves bytes dirty in a shared mapping with no sync point after them: the descriptor is
 * closed (its FLUSH goes out) before the store, and the process then waits, holding the
 * mapping, until it is killed. Prints "dirty" once the store is done. */
static int cmd_mmapdirty(const char *path, const char *off_s, const char *text)
{
    int fd = open(path, O_RDWR);
    ASSERT(fd >= 0, "open");
    struct stat st;
    ASSERT(fstat(fd, &st) == 0, "fstat");
    size_t off = strtoul(off_s, NULL, 0), len = strlen(text);
    ASSERT(off + len <= (size_t)st.st_size, "store past the end of the file");
    char *m = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED, "mmap MAP_SHARED rw");
    close(fd);
    memcpy(m + off, text, len);
    printf("dirty\n");
    fflush(stdout);
    for (;;)
        pause();
}

/*
 * lockwaiters FILE N BOUND: N processes wait with F_SETLKW for a write lock this one holds on
 * FILE, then this one closes FILE (its FLUSH frees the lock): every waiter must get the lock
 * in turn, one at a time, within BOUND seconds of the close. Prints
 * "LOCKWAITERS OK n=N took_ms=T" or fails.
 */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmd_lockwaiters(const char *path, int n, int bound)
{
    ASSERT(n > 0 && n <= 1000 && bound > 0, "bad N %d or BOUND %d", n, bound);
    int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC, 0644));
    OK(ftruncate(fd, 4096));
    struct flock wl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    OK(fcntl(fd, F_SETLK, &wl));
    int p[2];
    OK(pipe(p));
    pid_t *kids = calloc((size_t)n, sizeof(pid_t));
    ASSERT(kids != NULL, "calloc");
    for (int i = 0; i < n; i++) {
        pid_t pid = OK(fork());
        if (pid == 0) {
            close(p[0]);
            close(fd);
            int cfd = open(path, O_RDWR);
            struct flock l = wl;
            if (cfd < 0 || fcntl(cfd, F_SETLKW, &l) < 0)
                _exit(1);
            /* "+" with the lock, "-" just before the close that frees it. */
            if (write(p[1], "+", 1) != 1)
                _exit(1);
            usleep(2000);
            if (write(p[1], "-", 1) != 1)
                _exit(1);
            close(cfd);
            _exit(0);
        }
        kids[i] = pid;
    }
    close(p[1]);
    sleep(5);
    struct pollfd pf = { .fd = p[0], .events = POLLIN };
    ASSERT(poll(&pf, 1, 0) == 0, "a waiter had the lock while its holder held it");
    double t0 = now_s();
    OK(close(fd));
    double closed = now_s() - t0;
    int pluses = 0, minuses = 0;
    while (minuses < n) {
        int left = (int)((t0 + bound - now_s()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0)
            fail("%d of %d waiters had the lock within %d s (the holder's close took %.2f s)",
                 minuses, n, bound, closed);
        char buf[256];
        ssize_t r = read(p[0], buf, sizeof buf);
        if (r <= 0)
            fail("waiters ended early after %d of %d", minuses, n);
        for (ssize_t i = 0; i < r; i++) {
            if (buf[i] == '+')
                pluses++;
            else
                minuses++;
            ASSERT(pluses - minuses == 0 || pluses - minuses == 1,
                   "two waiters held the lock at once (%d in, %d out)", pluses, minuses);
        }
    }
    double took = now_s() - t0;
    for (int i = 0; i < n; i++) {
        int rc = wait_child(kids[i]);
        ASSERT(rc == 0, "waiter %d failed with status %d", i, rc);
    }
    free(kids);
    OK(unlink(path));
    printf("LOCKWAITERS OK n=%d took_ms=%d close_ms=%d\n", n, (int)(took * 1000), (int)(closed * 1000));
    return 0;
}

/*
 * lockhold FILE: takes a POSIX write lock on all of FILE (F_SETLK), prints LOCKED and
 * holds it until killed. lockbusy FILE: exits 0 when another process holds a conflicting
 * POSIX lock on FILE (F_SETLK fails with EAGAIN or EACCES, F_GETLK names a writer), 1 when
 * the lock could be taken.
 */
static int cmd_lockhold(const char *path)
{
    int fd = OK(open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    OK(fcntl(fd, F_SETLK, &fl));
    printf("LOCKED\n");
    fflush(stdout);
    for (;;)
        pause();
}

static int cmd_lockbusy(const char *path)
{
    int fd = OK(open(path, O_RDWR | O_CLOEXEC));
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    if (fcntl(fd, F_SETLK, &fl) == 0) {
        printf("LOCKBUSY free\n");
        return 1;
    }
    ASSERT(errno == EAGAIN || errno == EACCES, "F_SETLK: %s", strerror(errno));
    struct flock q = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    OK(fcntl(fd, F_GETLK, &q));
    ASSERT(q.l_type == F_WRLCK, "F_GETLK reports type %d", q.l_type);
    printf("LOCKBUSY held\n");
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: vfstest CHECK ARGS\n"
            "  locks FILE | mmap FILE | xattr FILE on|off | statfs DIR OUT\n"
            "  unlinkopen DIR | sparse FILE | seekdata FILE | utimes FILE\n"
            "  rename2 DIR | readdir DIR COUNT | append FILE | special DIR | direct FILE\n"
            "  mmapdirty FILE OFFSET TEXT | timeedges DIR set|check | seekedges FILE\n"
            "  mmapmtime FILE [SIZE] | busytext FILE | lockwaiters FILE N BOUND\n"
            "  lockhold FILE | lockbusy FILE\n");
    exit(2);
}

/*
 * busytext FILE: a program running from FILE (a copy of this one) keeps it from being
 * written: every open that would write or truncate it fails with ETXTBSY and leaves its
 * content, and the program runs on. Under FUSE_ATOMIC_O_TRUNC Linux sends an
 * O_RDONLY|O_TRUNC open's truncation to the server inside OPEN, before its own ETXTBSY
 * check: the server emptied the file and the program died of SIGBUS. Once the program
 * has exited, the same open truncates.
 */
static int cmd_busytext(const char *path)
{
    static char buf[65536];
    int src = OK(open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
    int dst = OK(open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755));
    ssize_t n;
    off_t size = 0;
    while ((n = read(src, buf, sizeof buf)) > 0) {
        write_all(dst, buf, (size_t)n, size);
        size += n;
    }
    ASSERT(n == 0 && size > 0, "copying /proc/self/exe");
    OK(close(src));
    OK(close(dst));
    int ready[2];
    OK(pipe(ready));
    pid_t pid = OK(fork());
    if (pid == 0) {
        char fd[16];
        close(ready[0]);
        snprintf(fd, sizeof fd, "%d", ready[1]);
        execl(path, "vfstest", "hold", fd, (char *)NULL);
        _exit(127);
    }
    held_child = pid;
    OK(close(ready[1]));
    char c;
    ASSERT(read(ready[0], &c, 1) == 1, "the copy at %s did not start", path);
    OK(close(ready[0]));
    FAILS(open(path, O_WRONLY), ETXTBSY);
    FAILS(open(path, O_RDWR), ETXTBSY);
    FAILS(open(path, O_RDONLY | O_TRUNC), ETXTBSY);
    FAILS(truncate(path, 0), ETXTBSY);
    struct stat st;
    OK(stat(path, &st));
    ASSERT(st.st_size == size, "size %lld after the refused opens, expected %lld",
           (long long)st.st_size, (long long)size);
    int status = 0;
    ASSERT(waitpid(pid, &status, WNOHANG) == 0, "the running copy ended (status %#x)", status);
    OK(kill(pid, SIGKILL));
    wait_child(pid);
    held_child = 0;
    int fd = OK(open(path, O_RDONLY | O_TRUNC));
    OK(fstat(fd, &st));
    ASSERT(st.st_size == 0, "size %lld after O_TRUNC of the idle file", (long long)st.st_size);
    OK(close(fd));
    OK(unlink(path));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage();
    check_name = argv[1];
    const char *c = argv[1];
    if (!strcmp(c, "locks")) return cmd_locks(argv[2]);
    if (!strcmp(c, "lockwaiters") && argc == 5)
        return cmd_lockwaiters(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (!strcmp(c, "mmap")) return cmd_mmap(argv[2]);
    if (!strcmp(c, "xattr") && argc == 4) return cmd_xattr(argv[2], argv[3]);
    if (!strcmp(c, "statfs") && argc == 4) return cmd_statfs(argv[2], argv[3]);
    if (!strcmp(c, "unlinkopen")) return cmd_unlinkopen(argv[2]);
    if (!strcmp(c, "sparse")) return cmd_sparse(argv[2]);
    if (!strcmp(c, "seekdata")) return cmd_seekdata(argv[2]);
    if (!strcmp(c, "utimes")) return cmd_utimes(argv[2]);
    if (!strcmp(c, "rename2")) return cmd_rename2(argv[2]);
    if (!strcmp(c, "readdir") && argc == 4) return cmd_readdir(argv[2], argv[3]);
    if (!strcmp(c, "append")) return cmd_append(argv[2]);
    if (!strcmp(c, "special")) return cmd_special(argv[2]);
    if (!strcmp(c, "direct")) return cmd_direct(argv[2]);
    if (!strcmp(c, "timeedges") && argc == 4) return cmd_timeedges(argv[2], argv[3]);
    if (!strcmp(c, "seekedges")) return cmd_seekedges(argv[2]);
    if (!strcmp(c, "mmapmtime")) return cmd_mmapmtime(argv[2], argc > 3 ? argv[3] : NULL);
    if (!strcmp(c, "mmapdirty") && argc == 5) return cmd_mmapdirty(argv[2], argv[3], argv[4]);
    if (!strcmp(c, "busytext")) return cmd_busytext(argv[2]);
    if (!strcmp(c, "lockhold")) return cmd_lockhold(argv[2]);
    if (!strcmp(c, "lockbusy")) return cmd_lockbusy(argv[2]);
    if (!strcmp(c, "hold")) {
        /* busytext's running copy: says it runs, then waits to be killed. */
        ASSERT(write(atoi(argv[2]), "r", 1) == 1, "hold: telling the parent");
        for (;;)
            pause();
    }
    usage();
}
