package pgserver

import "syscall"

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
