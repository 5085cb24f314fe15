/*
 * filebench: the etcfs workload (many files of one size, written, then read back) for the
 * `host` bench section (bench/host.py). One process, one file at a time, like the seed's
 * measurement: what it times is the per-file cost (LOOKUP/CREATE/OPEN/RELEASE round trips)
 * plus the data path.
 *
 *   filebench write DIR COUNT SIZE   create DIR/f000000 ... each SIZE bytes, close each
 *   filebench read  DIR COUNT SIZE   open, read to EOF (1 MiB reads), close each; checks sizes
 *
 * Prints one JSON line: {"op":..., "files":..., "bytes":..., "seconds":...}. Any error is
 * fatal (exit 1, with the file and the errno).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fail(const char *what, const char *path)
{
	fprintf(stderr, "filebench: %s %s: %s\n", what, path, strerror(errno));
	exit(1);
}

int main(int argc, char **argv)
{
	char path[4096];
	char *buf;
	long count, i;
	long long size, total = 0;
	double t0, t1;
	int writing;

	if (argc != 5 || (strcmp(argv[1], "write") && strcmp(argv[1], "read"))) {
		fprintf(stderr, "usage: filebench write|read DIR COUNT SIZE\n");
		return 2;
	}
	writing = !strcmp(argv[1], "write");
	count = strtol(argv[3], NULL, 10);
	size = strtoll(argv[4], NULL, 10);
	if (count <= 0 || size < 0) {
		fprintf(stderr, "filebench: COUNT must be > 0 and SIZE >= 0\n");
		return 2;
	}
	buf = malloc(CHUNK);
	if (!buf)
		return 1;
	for (i = 0; i < CHUNK; i++)
		buf[i] = (char)(i * 7 + 1);

	t0 = now();
	for (i = 0; i < count; i++) {
		long long left = size, got = 0;
		int fd;

		snprintf(path, sizeof(path), "%s/f%06ld", argv[2], i);
		if (writing) {
			fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
			if (fd < 0)
				fail("open", path);
			while (left > 0) {
				ssize_t n = write(fd, buf, left < CHUNK ? (size_t)left : CHUNK);

				if (n <= 0)
					fail("write", path);
				left -= n;
			}
			got = size;
		} else {
			fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				fail("open", path);
			for (;;) {
				ssize_t n = read(fd, buf, CHUNK);

				if (n < 0)
					fail("read", path);
				if (n == 0)
					break;
				got += n;
			}
			if (got != size) {
				fprintf(stderr, "filebench: %s: read %lld bytes, expected %lld\n",
					path, got, size);
				return 1;
			}
		}
		if (close(fd) < 0)
			fail("close", path);
		total += got;
	}
	t1 = now();
	printf("{\"op\": \"%s\", \"files\": %ld, \"bytes\": %lld, \"seconds\": %.6f}\n",
	       argv[1], count, total, t1 - t0);
	free(buf);
	return 0;
}
