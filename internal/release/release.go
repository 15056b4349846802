// Package release assembles everything a fencekeeper release publishes
// (make release, docs/releasing.md) into one directory, without a container
// daemon or a registry: the manager image as an OCI image layout (a tar,
// multi-arch index), install.yaml and the packaged chart pinned to that
// image by digest, the kubectl-fence archives and their krew manifest, SBOMs,
// the version's CHANGELOG section and SHA256SUMS over all of it.
package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Config is one release build. The Makefile's release target fills it.
type Config struct {
	Version  string    // the tag, v-semver: v0.1.0
	Commit   string    // the commit it is built from
	Root     string    // the repository's root
	Out      string    // where the artifacts go; absent or empty
	LDFlags  string    // the Makefile's LDFLAGS (internal/version stamps)
	Image    string    // the image repository, fully qualified: ghcr.io/fencekeeper/manager (a tag is dropped: see Repository)
	Source   string    // the source repository's URL (image label, krew homepage)
	Helm     string    // the helm binary that packages dist/chart
	Kubectl  string    // the kubectl binary that renders config/default
	Created  time.Time // every timestamp in the artifacts: the commit's time, so a rebuild is identical
	Log      io.Writer // progress
	GoBinary string    // the go command; "go" when empty
	// Platforms are the platforms to build the image and kubectl-fence for;
	// nil is all of them (PluginPlatforms). Fewer is for checking a release
	// on a machine with a cold build cache (make test): a published release
	// has all of them.
	Platforms []Platform
}

// Artifact names, relative to Config.Out.
const (
	ImageArchivePrefix = "fencekeeper-manager_" // + version + ".oci.tar"
	InstallYAML        = "install.yaml"
	KrewManifest       = "fence.yaml"
	ReleaseNotes       = "release-notes.md"
	Checksums          = "SHA256SUMS"
	ImageSBOMPrefix    = "fencekeeper-manager_" // + version + ".cdx.json"
	PluginSBOMPrefix   = "kubectl-fence_"       // + version + ".cdx.json"
)

// ImageArchive is the OCI layout tar of a version.
func ImageArchive(version string) string { return ImageArchivePrefix + version + ".oci.tar" }

// ImageSBOM is the manager image's SBOM of a version.
func ImageSBOM(version string) string { return ImageSBOMPrefix + version + ".cdx.json" }

// PluginSBOM is kubectl-fence's SBOM of a version.
func PluginSBOM(version string) string { return PluginSBOMPrefix + version + ".cdx.json" }

// semver is a release tag: v, then semantic versioning 2.0 (no build metadata:
// a "+" is not allowed in an image tag).
var semver = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// Result is what a release built.
type Result struct {
	IndexDigest string   // the image index's digest, sha256:<hex>
	ImageRef    string   // Image@IndexDigest: what install.yaml and the chart pin
	Files       []string // every artifact, sorted, SHA256SUMS last
}

// Validate checks everything that needs no build, so a bad input fails in
// a second instead of after the compiles.
func (c *Config) Validate() error {
	if !semver.MatchString(c.Version) {
		return fmt.Errorf("VERSION %q is not a release tag: want v<major>.<minor>.<patch>[-<pre-release>], e.g. v0.1.0", c.Version)
	}
	repo, err := Repository(c.Image)
	if err != nil {
		return err
	}
	c.Image = repo
	if _, err := ChangelogSection(filepath.Join(c.Root, "CHANGELOG.md"), c.Version); err != nil {
		return err
	}
	app, err := chartAppVersion(filepath.Join(c.Root, "dist", "chart", "Chart.yaml"))
	if err != nil {
		return err
	}
	if app != c.Version {
		return fmt.Errorf("dist/chart/Chart.yaml has appVersion %q but VERSION is %q: set appVersion (and version) to the release, run make build-installer and commit (docs/releasing.md)", app, c.Version)
	}
	if entries, err := os.ReadDir(c.Out); err == nil && len(entries) > 0 {
		return fmt.Errorf("output directory %s is not empty: remove it first (make release does)", c.Out)
	}
	if c.Platforms != nil && len(only(ImagePlatforms, c.Platforms)) == 0 {
		return fmt.Errorf("RELEASE_PLATFORMS %s has none of the manager image's platforms (%s)", platformList(c.Platforms), platformList(ImagePlatforms))
	}
	if c.Commit == "" || c.Created.IsZero() {
		return errors.New("the commit and its time are required (make release passes COMMIT and SOURCE_DATE_EPOCH)")
	}
	return nil
}

// Repository is the repository of an image name, its tag dropped (the
// release pins the digest instead). It refuses a name without a registry
// host: CRI-O in enforcing short-name mode will not pull
// "fencekeeper/manager", and others would guess a registry.
func Repository(image string) (string, error) {
	if strings.Contains(image, "@") {
		return "", fmt.Errorf("image %q already has a digest: give the repository (or repository:tag), the release pins the digest itself", image)
	}
	host, rest, ok := strings.Cut(image, "/")
	if !ok || rest == "" || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return "", fmt.Errorf("image %q is not fully qualified: name the registry host too, e.g. ghcr.io/fencekeeper/manager (set REGISTRY or IMG)", image)
	}
	if i := strings.LastIndex(rest, ":"); i >= 0 {
		rest = rest[:i]
	}
	return host + "/" + rest, nil
}

// Build assembles the release into c.Out.
func Build(ctx context.Context, c Config) (*Result, error) {
	if c.GoBinary == "" {
		c.GoBinary = "go"
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Platforms == nil {
		c.Platforms = PluginPlatforms
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(c.Platforms) < len(PluginPlatforms) {
		c.logf("a partial release, not for publishing: %s only", platformList(c.Platforms))
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "fencekeeper-release-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(work) }()

	start := time.Now()
	res := &Result{}
	steps := []struct {
		name string
		run  func() error
	}{
		{"manager image", func() error { return c.buildImage(ctx, work, res) }},
		{InstallYAML, func() error { return c.writeInstall(ctx, res.ImageRef) }},
		{"chart", func() error { return c.packageChart(ctx, work, res.ImageRef) }},
		{"kubectl-fence", func() error { return c.buildPlugin(ctx, work) }},
		{ReleaseNotes, c.writeReleaseNotes},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.run(); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		c.logf("%s done in %s", s.name, time.Since(t).Round(time.Second))
	}
	files, err := writeChecksums(c.Out)
	if err != nil {
		return nil, err
	}
	res.Files = files
	c.logf("release %s in %s (%s): %d files, image %s", c.Version, c.Out, time.Since(start).Round(time.Second), len(files), res.ImageRef)
	return res, nil
}

func (c *Config) logf(format string, args ...any) {
	_, _ = fmt.Fprintf(c.Log, "release: "+format+"\n", args...)
}

func (c *Config) writeReleaseNotes() error {
	section, err := ChangelogSection(filepath.Join(c.Root, "CHANGELOG.md"), c.Version)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Out, ReleaseNotes), []byte(section), 0o644)
}

// writeChecksums writes SHA256SUMS (sha256sum's format, so `sha256sum -c`
// checks it) over every other file in dir and returns all file names.
func writeChecksums(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	var sums strings.Builder
	for _, e := range entries {
		if e.IsDir() || e.Name() == Checksums {
			continue
		}
		sum, err := FileSHA256(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, e.Name())
		names = append(names, e.Name())
	}
	slices.Sort(names)
	if err := os.WriteFile(filepath.Join(dir, Checksums), []byte(sums.String()), 0o644); err != nil {
		return nil, err
	}
	return append(names, Checksums), nil
}

// FileSHA256 is the hex sha256 of a file.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
