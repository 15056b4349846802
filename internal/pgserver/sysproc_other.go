//go:build !linux

package pgserver

import (
	"errors"
	"os/exec"
	"syscall"
)

// sysProcAttr: without Linux's parent-death signal and, as root, without a
// way to change user here, the child runs as this process does (postgres
// then refuses root with a message of its own).
func sysProcAttr(*account) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}

// startIn starts cmd; network namespaces are Linux's.
func startIn(netns string, cmd *exec.Cmd) error {
	if netns != "" {
		return errors.New("Options.NetNS: network namespaces need Linux")
	}
	return cmd.Start()
}
