package pgserver

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr: the child runs as acct when there is one, in a process group
// of its own (a terminal's Ctrl-C reaches the test, not the server), and is
// killed when this process dies. Go sets the parent-death signal after the
// credentials, whose change would clear it.
func sysProcAttr(acct *account) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if acct != nil {
		attr.Credential = &syscall.Credential{Uid: acct.uid, Gid: acct.gid, Groups: []uint32{}}
	}
	return attr
}

// startIn starts cmd in the network namespace netns ("": this process's).
// A child inherits the namespaces of the thread that forks it: the fork runs
// on a locked thread moved into netns and moved back afterwards. A thread
// that cannot be moved back stays locked to a goroutine that never ends, so
// neither this process's other work nor the child's parent-death signal
// (tied to that thread) is disturbed.
func startIn(netns string, cmd *exec.Cmd) error {
	if netns == "" {
		return cmd.Start()
	}
	target, err := os.Open(netns)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("network namespace: %w", err)
			return
		}
		defer self.Close()
		if err := setns(target); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering network namespace %s: %w", netns, err)
			return
		}
		startErr := cmd.Start()
		if err := setns(self); err != nil {
			done <- startErr
			select {} // this thread stays in netns, and with the child
		}
		runtime.UnlockOSThread()
		done <- startErr
	}()
	return <-done
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }
