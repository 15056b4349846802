//go:build !linux

package pgserver

import "syscall"

// sysProcAttr: without Linux's parent-death signal and, as root, without a
// way to change user here, the child runs as this process does (postgres
// then refuses root with a message of its own).
func sysProcAttr(*account) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
