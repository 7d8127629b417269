package main

import (
	"fmt"
	"os"
	"syscall"
)

// createFile creates or truncates path with mode 0640 without following a
// symlink planted at path (O_NOFOLLOW).
func createFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o640)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return f, nil
}
