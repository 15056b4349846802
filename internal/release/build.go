package release

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Platform is one GOOS/GOARCH.
type Platform struct{ OS, Arch string }

func (p Platform) String() string { return p.OS + "/" + p.Arch }

// ImagePlatforms are the manager image's; PluginPlatforms kubectl-fence's,
// which include the image's (ParsePlatforms reads a subset of them).
var (
	ImagePlatforms  = []Platform{{"linux", "amd64"}, {"linux", "arm64"}}
	PluginPlatforms = []Platform{
		{"linux", "amd64"}, {"linux", "arm64"},
		{"darwin", "amd64"}, {"darwin", "arm64"},
		{"windows", "amd64"}, {"windows", "arm64"},
	}
)

// ParsePlatforms reads a comma-separated list of os/arch (make release's
// RELEASE_PLATFORMS) as a subset of from, in from's order; an empty list is
// all of from.
func ParsePlatforms(list string, from []Platform) ([]Platform, error) {
	if strings.TrimSpace(list) == "" {
		return slices.Clone(from), nil
	}
	var named []Platform
	for _, item := range strings.Split(list, ",") {
		os, arch, _ := strings.Cut(strings.TrimSpace(item), "/")
		p := Platform{os, arch}
		if !slices.Contains(from, p) {
			return nil, fmt.Errorf("platform %q is not one of %s", strings.TrimSpace(item), platformList(from))
		}
		if slices.Contains(named, p) {
			return nil, fmt.Errorf("platform %s is named twice", p)
		}
		named = append(named, p)
	}
	return only(from, named), nil
}

// only is the platforms of ps that are in subset, in ps's order.
func only(ps, subset []Platform) []Platform {
	return slices.DeleteFunc(slices.Clone(ps), func(p Platform) bool { return !slices.Contains(subset, p) })
}

func platformList(ps []Platform) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.String()
	}
	return strings.Join(names, ", ")
}

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
