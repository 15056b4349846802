package release

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestRepository(t *testing.T) {
	for in, want := range map[string]string{
		"ghcr.io/fencekeeper/manager":                     "ghcr.io/fencekeeper/manager",
		"ghcr.io/fencekeeper/manager:v0.1.0":              "ghcr.io/fencekeeper/manager",
		"registry.example.com:5000/fk/manager:v0.1.0":     "registry.example.com:5000/fk/manager",
		"localhost/manager":                               "localhost/manager",
		"fencekeeper/manager:v0.1.0":                      "not fully qualified",
		"manager":                                         "not fully qualified",
		"docker.io":                                       "not fully qualified",
		"ghcr.io/fencekeeper/manager@sha256:0123456789ab": "already has a digest",
	} {
		got, err := Repository(in)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("Repository(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidateRefusesBeforeBuilding(t *testing.T) {
	root := filepath.Join("..", "..")
	base := Config{Version: "v0.1.0", Commit: "c", Created: time.Unix(1, 0), Root: root, Image: "ghcr.io/fencekeeper/manager", Out: t.TempDir()}
	if app, err := chartAppVersion(filepath.Join(root, "dist", "chart", "Chart.yaml")); err != nil || app != base.Version {
		t.Skipf("dist/chart is for %s (%v): this test uses v0.1.0", app, err)
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("the release's own inputs: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Version = "0.1.0" }, "not a release tag"},
		{func(c *Config) { c.Version = "v0.1.0+build" }, "not a release tag"},
		{func(c *Config) { c.Version = "v7.0.0" }, "has no section for v7.0.0"},
		{func(c *Config) { c.Image = "fencekeeper/manager" }, "not fully qualified"},
		{func(c *Config) { c.Commit = "" }, "commit and its time are required"},
		{func(c *Config) { c.Out = root }, "is not empty"},
		{func(c *Config) { c.Platforms = []Platform{{"darwin", "arm64"}} }, "RELEASE_PLATFORMS darwin/arm64 has none of the manager image's platforms (linux/amd64, linux/arm64)"},
	} {
		c := base
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c, err, tc.want)
		}
	}
}

func TestChangelogSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "CHANGELOG.md")
	text := `# Changelog

## [Unreleased]

## [v0.2.0] - 2027-01-02

### Fixed

- a thing

## [0.1.0] - 2026-12-04

### Added

- everything

## [v0.0.9]

[v0.2.0]: https://example.com/v0.2.0
`
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	for version, want := range map[string]string{
		"v0.2.0": "## [v0.2.0] - 2027-01-02\n\n### Fixed\n\n- a thing\n",
		"v0.1.0": "## [0.1.0] - 2026-12-04\n\n### Added\n\n- everything\n",
		"v0.0.9": "error: " + path + ": the section for v0.0.9 is empty",
		"v0.3.0": "error: " + path + " has no section for v0.3.0",
	} {
		got, err := ChangelogSection(path, version)
		if err != nil {
			got = "error: " + err.Error()
		}
		if !strings.HasPrefix(got, want) {
			t.Errorf("section %s = %q, want %q", version, got, want)
		}
	}
}

// TestDockerfileMatchesReleaseImage: make docker-build and make release
// run the manager the same way.
func TestDockerfileMatchesReleaseImage(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	want := map[string]bool{"USER " + User: false, `ENTRYPOINT ["` + Entrypoint + `"]`: false}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if _, ok := want[strings.TrimSpace(sc.Text())]; ok {
			want[strings.TrimSpace(sc.Text())] = true
		}
	}
	for line, seen := range want {
		if !seen {
			t.Errorf("the Dockerfile has no %q line: it must run the manager as the release image does", line)
		}
	}
}

// TestPinImage: the chart's values keep everything but the image's
// repository and digest.
func TestPinImage(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "dist", "chart", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	pinned, err := pinImage(raw, "registry.example.com/fk/manager", digest)
	if err != nil {
		t.Fatal(err)
	}
	var before, after map[string]any
	if err := yaml.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(pinned, &after); err != nil {
		t.Fatal(err)
	}
	image, _ := after["image"].(map[string]any)
	if image["repository"] != "registry.example.com/fk/manager" || image["digest"] != digest {
		t.Errorf("pinned image values = %v", image)
	}
	before["image"].(map[string]any)["repository"], before["image"].(map[string]any)["digest"] = image["repository"], image["digest"]
	b, _ := yaml.Marshal(before)
	a, _ := yaml.Marshal(after)
	if string(a) != string(b) {
		t.Errorf("pinning changed more than the image:\n%s\nwant\n%s", a, b)
	}
	before2, after2 := strings.Split(string(raw), "\n"), strings.Split(string(pinned), "\n")
	changed := 0
	for i := range min(len(before2), len(after2)) {
		if before2[i] != after2[i] {
			changed++
		}
	}
	if len(before2) != len(after2) || changed != 2 {
		t.Errorf("pinning changed %d lines (of %d, now %d); want the repository and digest lines only:\n%s", changed, len(before2), len(after2), pinned)
	}
	for _, written := range []string{`plain/name`, `'single/quoted'`, `"double/quoted"`} {
		v := strings.Replace(string(raw), `repository: ghcr.io/fencekeeper/manager`, `repository: `+written, 1)
		if _, err := pinImage([]byte(v), "r.example.com/x", digest); err != nil {
			t.Errorf("pinning a values file whose repository is %s: %v", written, err)
		}
	}
	if _, err := pinImage([]byte("replicas: 2\n"), "r", digest); err == nil {
		t.Error("pinning values without an image mapping succeeded")
	}
}
