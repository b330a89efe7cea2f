//go:build !linux

package graph

import "os"

// startWriteback does nothing where sync_file_range is missing: the fsync
// before the output's rename writes the whole file.
func startWriteback(f *os.File, off, n int64) {}
