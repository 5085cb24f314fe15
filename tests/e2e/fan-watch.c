// A guest fanotify watcher for tests/e2e/notify.sh (issue #42): host changes must reach
// fanotify watchers in the guest as they reach inotify ones.
//
//   fan-watch DIR...
//
// Marks each DIR (an inode mark: FUSE reports no fsid, so Linux allows fanotify's file-id
// mode on inode marks only) for entry and child events, in FAN_REPORT_DFID_NAME mode, prints
// "FAN READY" once every mark is in place, then one line per event and flag, as it reads
// them: "FAN <EVENT> <DIR>/<name>" (EVENT: CREATE, DELETE, MODIFY, ATTRIB, MOVED_FROM,
// MOVED_TO; "FAN OVERFLOW" for a lost-events marker). The directory is told by its file
// handle, taken with name_to_handle_at(AT_HANDLE_FID) at start. Runs until killed.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fanotify.h>
#include <unistd.h>

#ifndef AT_HANDLE_FID
#define AT_HANDLE_FID 0x200
#endif

#define MAX_DIRS 16
#define HANDLE_MAX 128

struct dir {
    const char *path;
    union {
        struct file_handle fh;
        char space[sizeof(struct file_handle) + HANDLE_MAX];
    } h;
};

static const struct {
    uint64_t bit;
    const char *name;
} events[] = {
    {FAN_CREATE, "CREATE"},         {FAN_MODIFY, "MODIFY"},     {FAN_ATTRIB, "ATTRIB"},
    {FAN_MOVED_FROM, "MOVED_FROM"}, {FAN_MOVED_TO, "MOVED_TO"}, {FAN_DELETE, "DELETE"},
};

int main(int argc, char **argv)
{
    static struct dir dirs[MAX_DIRS];
    int ndirs = argc - 1;
    if (ndirs < 1 || ndirs > MAX_DIRS) {
        fprintf(stderr, "usage: %s DIR... (1 to %d directories)\n", argv[0], MAX_DIRS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int fd = fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_DFID_NAME, O_RDONLY);
    if (fd < 0) {
        perror("fanotify_init");
        return 1;
    }
    uint64_t mask = FAN_CREATE | FAN_DELETE | FAN_MODIFY | FAN_ATTRIB | FAN_MOVED_FROM |
                    FAN_MOVED_TO | FAN_EVENT_ON_CHILD | FAN_ONDIR;
    for (int i = 0; i < ndirs; i++) {
        dirs[i].path = argv[i + 1];
        if (fanotify_mark(fd, FAN_MARK_ADD, mask, AT_FDCWD, dirs[i].path) < 0) {
            fprintf(stderr, "fanotify_mark %s: %m\n", dirs[i].path);
            return 1;
        }
        int mount_id;
        dirs[i].h.fh.handle_bytes = HANDLE_MAX;
        if (name_to_handle_at(AT_FDCWD, dirs[i].path, &dirs[i].h.fh, &mount_id,
                              AT_HANDLE_FID) < 0) {
            fprintf(stderr, "name_to_handle_at %s: %m\n", dirs[i].path);
            return 1;
        }
    }
    printf("FAN READY\n");
    static char buf[16384] __attribute__((aligned(8)));
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            perror("read");
            return 1;
        }
        struct fanotify_event_metadata *m = (struct fanotify_event_metadata *)buf;
        for (; FAN_EVENT_OK(m, n); m = FAN_EVENT_NEXT(m, n)) {
            if (m->mask & FAN_Q_OVERFLOW) {
                printf("FAN OVERFLOW\n");
                continue;
            }
            struct fanotify_event_info_fid *fid = (struct fanotify_event_info_fid *)(m + 1);
            struct file_handle *fh = (struct file_handle *)fid->handle;
            const char *name = "";
            if (fid->hdr.info_type == FAN_EVENT_INFO_TYPE_DFID_NAME)
                name = (const char *)fh->f_handle + fh->handle_bytes;
            const char *dir = "?";
            for (int i = 0; i < ndirs; i++) {
                const struct file_handle *d = &dirs[i].h.fh;
                if (d->handle_type == fh->handle_type && d->handle_bytes == fh->handle_bytes &&
                    !memcmp(d->f_handle, fh->f_handle, fh->handle_bytes)) {
                    dir = dirs[i].path;
                    break;
                }
            }
            for (size_t e = 0; e < sizeof(events) / sizeof(events[0]); e++)
                if (m->mask & events[e].bit)
                    printf("FAN %s %s%s%s\n", events[e].name, dir, *name ? "/" : "", name);
        }
    }
}
