/*
 * The guest writer of tests/e2e/dax-full.sh (built static on the host, run from the share):
 *
 *   dax-full-writer write|mmap SRC DST [GO]
 *
 * Opens DST read-write; with GO, loads its first byte through a shared mapping (the guest
 * maps that range read-only), says "opened" and waits until the file GO exists (the host
 * acts between the open and the first store). Then copies SRC over the start of DST:
 *   write  pwrite(2) in 1 MiB pieces, then fsync(2) (what `dd conv=notrunc,fsync` does);
 *   mmap   stores through a MAP_SHARED mapping, then msync(MS_SYNC), munmap, fsync(2).
 * Prints "dax-full-writer: STEP: ENAME (text)" and exits 1 at the first failed call, or
 * "dax-full-writer: done" and exits 0. A store the kernel cannot back kills it with SIGBUS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PIECE (1 << 20)

static const char *ename(int e)
{
    switch (e) {
    case ENOSPC: return "ENOSPC";
    case EDQUOT: return "EDQUOT";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EIO: return "EIO";
    case EROFS: return "EROFS";
    case EFBIG: return "EFBIG";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ENOENT: return "ENOENT";
    default: return "E?";
    }
}

static int fail(const char *step, int e)
{
    printf("dax-full-writer: %s: %s (%s)\n", step, ename(e), strerror(e));
    fflush(stdout);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5 || (strcmp(argv[1], "write") && strcmp(argv[1], "mmap"))) {
        fprintf(stderr, "usage: dax-full-writer write|mmap SRC DST [GO]\n");
        return 2;
    }
    int mm = !strcmp(argv[1], "mmap");
    int s = open(argv[2], O_RDONLY);
    if (s < 0)
        return fail("open source", errno);
    struct stat st;
    if (fstat(s, &st) < 0)
        return fail("fstat source", errno);
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return fail("malloc", ENOMEM);
    while (got < size) {
        ssize_t n = pread(s, buf + got, size - got, (off_t)got);
        if (n <= 0)
            return fail("read source", n < 0 ? errno : EIO);
        got += (size_t)n;
    }
    close(s);
    int d = open(argv[3], O_RDWR);
    if (d < 0)
        return fail("open", errno);
    if (argc == 5) {
        /* A load through a mapping first: the guest maps the range (read-only), so the
         * daemon holds the file open for DAX before the host acts. */
        const char *r = mmap(NULL, 4096, PROT_READ, MAP_SHARED, d, 0);
        if (r == MAP_FAILED)
            return fail("mmap to read", errno);
        volatile char c = r[0];
        (void)c;
        if (munmap((void *)r, 4096) < 0)
            return fail("munmap after reading", errno);
        printf("dax-full-writer: opened\n");
        fflush(stdout);
        for (int i = 0; access(argv[4], F_OK) != 0; i++) {
            if (i == 3000)
                return fail("waiting for the host", ETIMEDOUT);
            usleep(100000);
        }
    }
    if (mm) {
        char *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, d, 0);
        if (m == MAP_FAILED)
            return fail("mmap", errno);
        for (size_t off = 0; off < size; off += PIECE)
            memcpy(m + off, buf + off, size - off < PIECE ? size - off : PIECE);
        if (msync(m, size, MS_SYNC) < 0)
            return fail("msync", errno);
        if (munmap(m, size) < 0)
            return fail("munmap", errno);
    } else {
        for (size_t off = 0; off < size;) {
            size_t len = size - off < PIECE ? size - off : PIECE;
            ssize_t n = pwrite(d, buf + off, len, (off_t)off);
            if (n < 0)
                return fail("write", errno);
            if (n == 0)
                return fail("write", EIO);
            off += (size_t)n;
        }
    }
    if (fsync(d) < 0)
        return fail("fsync", errno);
    if (close(d) < 0)
        return fail("close", errno);
    printf("dax-full-writer: done\n");
    return 0;
}
