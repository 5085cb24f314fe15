/*
 * as-user UID GID PROG [ARGS...]: run PROG as UID:GID with no supplementary groups (busybox's
 * setpriv cannot change ids). Built static by tests/e2e/never.sh into the share.
 */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: as-user UID GID PROG [ARGS...]\n");
		return 2;
	}
	if (setgroups(0, NULL) || setgid((gid_t)atoi(argv[2])) || setuid((uid_t)atoi(argv[1]))) {
		perror("as-user");
		return 2;
	}
	execvp(argv[3], argv + 3);
	perror("as-user: exec");
	return 127;
}
