package release

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Platform is one GOOS/GOARCH.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// ImagePlatforms are the manager image's; PluginPlatforms kubectl-fence's.
var (
	ImagePlatforms  = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}
	PluginPlatforms = []Platform{
		{"linux", "amd64"}, {"linux", "arm64"},
		{"darwin", "amd64"}, {"darwin", "arm64"},
		{"windows", "amd64"}, {"windows", "arm64"},
	}
)

// goBuild builds one binary of the module for p: static (CGO_ENABLED=0),
// without the build machine's paths (-trimpath), stripped of the symbol
// table (-s -w: the build info the SBOMs read stays) and stamped with the
// Makefile's LDFLAGS. It returns the binary's path.
func (c *Config) goBuild(ctx context.Context, dir, pkg string, p Platform) (string, error) {
	name := filepath.Base(pkg)
	if p.OS == "windows" {
		name += ".exe"
	}
	out := filepath.Join(dir, p.OS+"_"+p.Arch, name)
	cmd := exec.CommandContext(ctx, c.GoBinary, "build", "-trimpath", "-buildvcs=false",
		"-ldflags", strings.TrimSpace("-s -w "+c.LDFlags), "-o", out, pkg)
	cmd.Dir = c.Root
	// The commit comes from LDFLAGS (-buildvcs=false): the same commit builds
	// the same binary wherever it is checked out.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Arch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s for %s: %w\n%s", pkg, p, err, stderr.String())
	}
	// The CPU time (the compiler and linker processes included) says what
	// a build costs whatever else the machine runs.
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	c.logf("built %s for %s in %s (cpu %s)", pkg, p, time.Since(start).Round(time.Second), cpu.Round(time.Second))
	return out, nil
}
