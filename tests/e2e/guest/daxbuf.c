/*
 * daxbuf: I/O whose buffer is a DAX mapping (issue #43; what fstests generic/638 and
 * generic/708 do), for a virtio-fs mount with -o dax=always. Built on the host with
 * `gcc -static` by tests/e2e/dax-buffers.sh and run from the share.
 *
 *   daxbuf overlap DIR   t_mmap_writev_overlap: two pages of a file mapped, 64 distinct bytes
 *                        at the start of each, then a pwritev of those two mapped pieces back
 *                        into the same file at 2 * page - 64 (extending it: a FUSE_WRITE whose
 *                        second half lands in a page that is also a source)
 *   daxbuf dio DIR       an O_DIRECT write of a new file whose buffer is a DAX mapping of
 *                        another file, touched first (1 MiB: more than one mapped range)
 *   daxbuf read DIR      a read of a file never read before (the hybrid policy serves such
 *                        a miss with FUSE_READ into the user buffer) into a writable DAX
 *                        mapping of another file, at an odd offset
 *
 * Each check exits 0 when the bytes are right (read back through the mount, and through
 * the mapping for `read`), 1 otherwise with "daxbuf: CHECK: what" on stderr. Each leaves the
 * bytes it expects in FILE.want next to the file it checks, for the host to compare.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *check_name = "?";

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    int e = errno;
    fprintf(stderr, "daxbuf: %s: ", check_name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (errno %d: %s)\n", e, strerror(e));
    exit(1);
}

#define ASSERT(cond, ...) do { if (!(cond)) fail(__VA_ARGS__); } while (0)
#define OK(call) ({ errno = 0; __typeof__(call) r_ = (call); ASSERT(r_ >= 0, "%s failed", #call); r_; })

static void fill(char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)((i * 2654435761u + seed) >> 13);
}

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

/* The file's bytes equal `want` (read back through the mount), and a copy of `want` is left
 * in PATH.want for the host to compare with its file. */
static void expect_file(const char *path, const char *want, size_t len)
{
    char *got = malloc(len + 1);
    ASSERT(got, "malloc");
    int fd = OK(open(path, O_RDONLY));
    ssize_t n = pread(fd, got, len + 1, 0);
    ASSERT(n == (ssize_t)len, "%s: %zd bytes, want %zu", path, n, len);
    for (size_t i = 0; i < len; i++)
        ASSERT(got[i] == want[i], "%s: byte %zu is %#x, want %#x", path, i,
               (unsigned char)got[i], (unsigned char)want[i]);
    close(fd);
    char w[4096];
    snprintf(w, sizeof w, "%s.want", path);
    int wfd = OK(open(w, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    write_all(wfd, want, len, 0);
    OK(fsync(wfd));
    close(wfd);
    free(got);
}

static int cmd_overlap(const char *dir)
{
    char path[4096];
    long p = sysconf(_SC_PAGESIZE);
    int fd = OK(open(join(path, dir, "overlap"), O_RDWR | O_CREAT | O_TRUNC, 0644));
    char *want = malloc(2 * p + 64), a[64], b[64];
    ASSERT(want, "malloc");
    memset(want, 0x55, 2 * p);
    write_all(fd, want, 2 * p, 0);
    fill(a, 64, 1);
    fill(b, 64, 2);
    write_all(fd, a, 64, 0);
    write_all(fd, b, 64, p);
    OK(fsync(fd));
    char *m = mmap(NULL, 2 * p, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(m != MAP_FAILED, "mmap");
    ASSERT(!memcmp(m, a, 64) && !memcmp(m + p, b, 64), "the mapping does not show the pwrites");
    struct iovec iov[2] = { { m, 64 }, { m + p, 64 } };
    ssize_t n = pwritev(fd, iov, 2, 2 * p - 64);
    ASSERT(n == 128, "pwritev from the mapping returned %zd", n);
    OK(munmap(m, 2 * p));
    close(fd);
    memcpy(want, a, 64);
    memcpy(want + p, b, 64);
    memcpy(want + 2 * p - 64, a, 64);
    memcpy(want + 2 * p, b, 64);
    expect_file(path, want, 2 * p + 64);
    return 0;
}

static int cmd_dio(const char *dir)
{
    char src[4096], dst[4096];
    size_t len = 1 << 20;
    char *want = malloc(len);
    ASSERT(want, "malloc");
    fill(want, len, 7);
    int s = OK(open(join(src, dir, "dio-src"), O_RDWR | O_CREAT | O_TRUNC, 0644));
    write_all(s, want, len, 0);
    OK(fsync(s));
    char *m = mmap(NULL, len, PROT_READ, MAP_SHARED, s, 0);
    ASSERT(m != MAP_FAILED, "mmap");
    /* Touched first, as generic/708 does: every page mapped before the write. */
    volatile unsigned sum = 0;
    for (size_t i = 0; i < len; i += 4096)
        sum += (unsigned char)m[i];
    int d = OK(open(join(dst, dir, "dio-dst"), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644));
    ssize_t n = write(d, m, len);
    ASSERT(n == (ssize_t)len, "O_DIRECT write from the mapping returned %zd", n);
    close(d);
    OK(munmap(m, len));
    close(s);
    expect_file(dst, want, len);
    return 0;
}

static int cmd_read(const char *dir)
{
    char tpath[4096], spath[4096];
    size_t tlen = 1 << 20, slen = 64 << 10, at = 4096 + 100;
    char *want = malloc(tlen), *sdata = malloc(slen);
    ASSERT(want && sdata, "malloc");
    fill(want, tlen, 3);
    fill(sdata, slen, 4);
    int t = OK(open(join(tpath, dir, "read-target"), O_RDWR | O_CREAT | O_TRUNC, 0644));
    write_all(t, want, tlen, 0);
    int s = OK(open(join(spath, dir, "read-src"), O_RDWR | O_CREAT | O_TRUNC, 0644));
    write_all(s, sdata, slen, 0);
    OK(fsync(t));
    OK(fsync(s));
    close(s);
    char *m = mmap(NULL, tlen, PROT_READ | PROT_WRITE, MAP_SHARED, t, 0);
    ASSERT(m != MAP_FAILED, "mmap");
    /* Writable mappings of the pages the read fills (a store of the bytes they hold). */
    for (size_t i = 0; i < tlen; i += 4096)
        m[i] = want[i];
    s = OK(open(spath, O_RDONLY));
    ssize_t n = read(s, m + at, slen);
    ASSERT(n == (ssize_t)slen, "read into the mapping returned %zd", n);
    close(s);
    memcpy(want + at, sdata, slen);
    for (size_t i = 0; i < tlen; i++)
        ASSERT(m[i] == want[i], "the mapping's byte %zu is %#x, want %#x", i,
               (unsigned char)m[i], (unsigned char)want[i]);
    OK(msync(m, tlen, MS_SYNC));
    OK(munmap(m, tlen));
    close(t);
    expect_file(tpath, want, tlen);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: daxbuf overlap|dio|read DIR\n");
        return 2;
    }
    check_name = argv[1];
    if (!strcmp(argv[1], "overlap")) return cmd_overlap(argv[2]);
    if (!strcmp(argv[1], "dio")) return cmd_dio(argv[2]);
    if (!strcmp(argv[1], "read")) return cmd_read(argv[2]);
    fprintf(stderr, "daxbuf: unknown check %s\n", argv[1]);
    return 2;
}
