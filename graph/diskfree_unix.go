//go:build linux || darwin || freebsd

package graph

import "syscall"

// freeBytes is the space an unprivileged writer may still use on the file
// system holding dir, or -1 when it cannot be told.
func freeBytes(dir string) int64 {
	var s syscall.Statfs_t
	if syscall.Statfs(dir, &s) != nil {
		return -1
	}
	return int64(s.Bavail) * int64(s.Bsize) //nolint:unconvert // field types differ by platform
}
