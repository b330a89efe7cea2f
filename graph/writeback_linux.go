package graph

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing f's bytes [off,
// off+n) to disk without waiting for it (sync_file_range), so that the
// fsync before the output's rename finds most of the file written already.
// It is advice: an error is ignored (the fsync reports real ones).
func startWriteback(f *os.File, off, n int64) {
	c, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = c.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
