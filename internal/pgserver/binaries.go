package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// binaries is the directory holding initdb and postgres (initdb runs the
// postgres beside it, so they are found together).
type binaries struct {
	dir string
}

// BinDirEnv names the environment variable that chooses the server binaries.
const BinDirEnv = "FENCEKEEPER_PG_BINDIR"

// debianRoot is where Debian and Ubuntu install each major version's server.
const debianRoot = "/usr/lib/postgresql"

// findBinaries is the search the package comment describes. A directory
// named explicitly (binDir, $FENCEKEEPER_PG_BINDIR) must hold both programs.
func findBinaries(binDir string) (binaries, error) {
	for _, named := range []struct{ dir, from string }{{binDir, "Options.BinDir"}, {os.Getenv(BinDirEnv), "$" + BinDirEnv}} {
		if named.dir == "" {
			continue
		}
		if !holdsServer(named.dir) {
			return binaries{}, fmt.Errorf("pgserver: %s=%s holds no initdb and postgres", named.from, named.dir)
		}
		return binaries{dir: named.dir}, nil
	}
	if dir := debianBinDir(); dir != "" {
		return binaries{dir: dir}, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); holdsServer(dir) {
			return binaries{dir: dir}, nil
		}
	}
	if path, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(path); err == nil && holdsServer(filepath.Dir(resolved)) {
			return binaries{dir: filepath.Dir(resolved)}, nil
		}
	}
	return binaries{}, errors.New("pgserver: no PostgreSQL server binaries (initdb and postgres) in " +
		debianRoot + "/*/bin, pg_config --bindir or PATH: run make postgres " +
		"(apt-get install postgresql), or set " + BinDirEnv)
}

// debianBinDir is the highest version's bin directory under debianRoot
// holding both programs, or "".
func debianBinDir() string {
	dirs, _ := filepath.Glob(filepath.Join(debianRoot, "*", "bin"))
	dirs = slices.DeleteFunc(dirs, func(dir string) bool { return !holdsServer(dir) })
	if len(dirs) == 0 {
		return ""
	}
	return slices.MaxFunc(dirs, func(a, b string) int {
		return slices.Compare(version(a), version(b))
	})
}

// version reads ".../postgresql/9.6/bin" as [9 6]; what is not a number
// counts as 0.
func version(binDir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, _ := strconv.Atoi(part)
		v = append(v, n)
	}
	return v
}

// holdsServer: dir has executable initdb and postgres.
func holdsServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}
