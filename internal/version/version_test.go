package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFillFromBuildInfo(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	cases := []struct {
		name                    string
		stamped                 Info
		bi                      debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{"ldflags win over build info", Info{Version: "v1.2.3", Commit: "abc"},
			debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"}, Settings: vcs("def", "true")}, "v1.2.3", "abc"},
		{"go install module@version", Info{},
			debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0", ""},
		{"checkout build: devel module, dirty revision", Info{},
			debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("def", "true")}, "", "def-dirty"},
		{"clean revision", Info{},
			debug.BuildInfo{Settings: vcs("def", "false")}, "", "def"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.stamped
			fillFromBuildInfo(&got, &c.bi)
			if got.Version != c.wantVersion || got.Commit != c.wantCommit {
				t.Fatalf("got version %q commit %q, want %q %q", got.Version, got.Commit, c.wantVersion, c.wantCommit)
			}
		})
	}
}

func TestGetNeverEmpty(t *testing.T) {
	old, oldCommit := Version, Commit
	t.Cleanup(func() { Version, Commit = old, oldCommit })
	Version, Commit = "", ""
	i := Get()
	if i.Version == "" || i.Commit == "" || i.GoVersion == "" || i.Platform == "" {
		t.Fatalf("Get() left a field empty: %+v", i)
	}
	Version, Commit = "v1.0.0", "0123abc"
	if s := String(); !strings.HasPrefix(s, "v1.0.0 (commit 0123abc, go") {
		t.Fatalf("String() = %q", s)
	}
}
