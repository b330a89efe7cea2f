//go:build unix

package graph

import "syscall"

// zeroPages returns n read-only zero bytes that take no memory until read
// (an anonymous mapping), and the function that unmaps them.
func zeroPages(n int) ([]byte, func(), error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { syscall.Munmap(b) }, nil
}
