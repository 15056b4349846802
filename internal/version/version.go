// Package version is the build's version, stamped at link time:
//
//	go build -ldflags "-X github.com/fencekeeper/fencekeeper/internal/version.Version=v0.1.0 \
//	  -X github.com/fencekeeper/fencekeeper/internal/version.Commit=$(git rev-parse HEAD)"
//
// make build and the Dockerfile set both. An unstamped build (go run, go
// test) falls back to the module version and VCS revision Go records, so a
// binary never claims a release it is not.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version and Commit are set with -ldflags -X; empty means "not stamped".
var (
	Version string
	Commit  string
)

// Info describes one binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the stamped version, or what the Go toolchain recorded.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fillFromBuildInfo(&info, bi)
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	return info
}

// fillFromBuildInfo fills what -ldflags left empty from Go's build info: the
// module version (go install module@version) and vcs.revision (builds in a
// checkout without -buildvcs=false).
func fillFromBuildInfo(info *Info, bi *debug.BuildInfo) {
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Commit != "" {
		return
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		info.Commit = rev + dirty
	}
}

// String is one line: "v0.1.0 (commit abc123, go1.26.0, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}

// String is Get().String().
func String() string { return Get().String() }
