//go:build unix

package graph

import (
	"os"
	"syscall"
)

// lockFolder takes an exclusive advisory lock (flock) on dir, waiting for
// any other holder, and returns the function that releases it. Save holds
// it while it renames a model and its side file into place, so that two
// processes saving to one target cannot interleave their renames and
// leave one's model naming the other's side file. Where the folder cannot
// be locked (a file system without flock), Save goes on without it.
func lockFolder(dir string) func() {
	f, err := os.Open(dir)
	if err != nil {
		return func() {}
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}
