package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// account is the unprivileged user initdb and postgres run as when this
// process is root (postgres refuses to run as root).
type account struct {
	name     string
	uid, gid uint32
}

// runAs is nil unless the effective user is root; then it is nobody, in
// group nogroup (Debian) or nobody (elsewhere).
func runAs() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("nobody")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, postgres needs an unprivileged user: %w", err)
	}
	gid := u.Gid
	for _, name := range []string{"nogroup", "nobody"} {
		if g, err := user.LookupGroup(name); err == nil {
			gid = g.Gid
			break
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	g, err2 := strconv.ParseUint(gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgserver: user nobody: %w", err)
	}
	return &account{name: "nobody", uid: uint32(uid), gid: uint32(g)}, nil
}

// chown gives path to the account; nothing to do without one.
func (a *account) chown(path string) error {
	if a == nil {
		return nil
	}
	return os.Chown(path, int(a.uid), int(a.gid))
}

// describe is for errors: whom the server runs as, when that is not us.
func (a *account) describe() string {
	if a == nil {
		return ""
	}
	return fmt.Sprintf(" (as user %s, uid %d: running as root; its binaries and directory must be open to that user)", a.name, a.uid)
}

// maxSocketPath is the length of sockaddr_un's sun_path, less its NUL.
const maxSocketPath = 107

// makeRoot creates the server's directory (mode 0755, the account's). With
// an account every directory above it must be traversable by others:
// os.TempDir, else /tmp.
func makeRoot(acct *account) (string, error) {
	base := os.TempDir()
	if acct != nil && !traversable(base) {
		if !traversable("/tmp") {
			return "", fmt.Errorf("pgserver: running as root, but neither %s nor /tmp is traversable by user %s: set TMPDIR", base, acct.name)
		}
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "fencekeeper-pg-")
	if err != nil {
		return "", fmt.Errorf("pgserver: %w", err)
	}
	if err := errors.Join(os.Chmod(dir, 0o755), acct.chown(dir)); err != nil {
		return "", errors.Join(fmt.Errorf("pgserver: %w", err), os.RemoveAll(dir))
	}
	if socket := filepath.Join(dir, ".s.PGSQL.65535"); len(socket) > maxSocketPath {
		return "", errors.Join(fmt.Errorf("pgserver: the socket path %s would be longer than %d bytes: set a shorter TMPDIR", socket, maxSocketPath), os.RemoveAll(dir))
	}
	return dir, nil
}

// traversable: every directory from dir up to / may be searched by others.
func traversable(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}
