// Package release runs `make release` into a temporary directory, once,
// and checks every artifact from that run as a user of the release would
// meet it: the OCI archive loaded with go-containerregistry, install.yaml
// and the chart pinned to its index digest, SHA256SUMS, the krew manifest
// against the archives, the SBOMs against go.mod and go.sum, and the
// CHANGELOG section. The release cross-compiles eight binaries, so it is
// built once (make test runs this package alone). RELEASE_PLATFORMS
// (make's) narrows the platforms: make test builds for linux/amd64 only,
// since each other platform costs a cold build cache three to four
// minutes; make test-release builds and checks all of them.
package release

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"debug/elf"
	"debug/macho"
	"debug/pe"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"

	"github.com/fencekeeper/fencekeeper/internal/release"
)

// helmVersion is the Makefile's HELM_VERSION: make release builds
// bin/tools/helm-<version> when it is missing.
const helmVersion = "v3.22.0"

// TestMakeReleaseRefusesBadVersions: each refusal names what was wrong
// before anything is compiled.
func TestMakeReleaseRefusesBadVersions(t *testing.T) {
	root := repoRoot(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "make release needs the release tag: make release VERSION=v0.1.0"},
		{[]string{"VERSION=0.1.0"}, `VERSION "0.1.0" is not a release tag`},
		{[]string{"VERSION=v0.1"}, `VERSION "v0.1" is not a release tag`},
		{[]string{"VERSION=v9.9.9"}, "CHANGELOG.md has no section for v9.9.9"},
		{[]string{"VERSION=v0.1.0", "IMG=fencekeeper/manager:v0.1.0"}, `image "fencekeeper/manager:v0.1.0" is not fully qualified`},
		{[]string{"VERSION=v0.1.0", "RELEASE_PLATFORMS=linux/386"}, `RELEASE_PLATFORMS: platform "linux/386" is not one of linux/amd64`},
		{[]string{"VERSION=v0.1.0", "RELEASE_PLATFORMS=darwin/arm64"}, `RELEASE_PLATFORMS darwin/arm64 has none of the manager image's platforms`},
	} {
		out, err := makeRelease(root, t.TempDir(), tc.args...)
		if err == nil {
			t.Errorf("make release %v succeeded; want a refusal with %q", tc.args, tc.want)
			continue
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("make release %v: output does not say %q:\n%s", tc.args, tc.want, out)
		}
	}
}

func TestMakeRelease(t *testing.T) {
	root := repoRoot(t)
	version := chartAppVersion(t, root)
	out := filepath.Join(t.TempDir(), "release")
	platforms, err := release.ParsePlatforms(os.Getenv("RELEASE_PLATFORMS"), release.PluginPlatforms)
	if err != nil {
		t.Fatalf("RELEASE_PLATFORMS: %v", err)
	}
	if len(platforms) < len(release.PluginPlatforms) {
		t.Logf("built for %v only (RELEASE_PLATFORMS); make test-release checks all of %v", platforms, release.PluginPlatforms)
	}
	images := slices.DeleteFunc(slices.Clone(release.ImagePlatforms), func(p release.Platform) bool { return !slices.Contains(platforms, p) })
	plugins := slices.DeleteFunc(slices.Clone(release.PluginPlatforms), func(p release.Platform) bool { return !slices.Contains(platforms, p) })
	start := time.Now()
	output, err := makeRelease(root, out, "VERSION="+version)
	if err != nil {
		t.Fatalf("make release VERSION=%s: %v\n%s", version, err, output)
	}
	t.Logf("make release VERSION=%s took %s:\n%s", version, time.Since(start).Round(time.Second), output)

	commit := strings.TrimSpace(string(run(t, root, "git", "rev-parse", "HEAD")))
	digest := checkImage(t, out, version, commit, images)
	ref := "ghcr.io/fencekeeper/manager@" + digest
	t.Run("install.yaml pins the index digest", func(t *testing.T) {
		checkImageRef(t, "install.yaml", mustRead(t, filepath.Join(out, release.InstallYAML)), ref)
	})
	t.Run("the packaged chart pins the index digest", func(t *testing.T) {
		charts, _ := filepath.Glob(filepath.Join(out, "fencekeeper-*.tgz"))
		if len(charts) != 1 {
			t.Fatalf("want one packaged chart fencekeeper-*.tgz, got %v", charts)
		}
		helm := filepath.Join(root, "bin", "tools", "helm-"+helmVersion)
		rendered, err := exec.Command(helm, "template", "fencekeeper", charts[0], "--kube-version", "1.31.0").Output()
		if err != nil {
			t.Fatalf("helm template %s: %v", charts[0], err)
		}
		checkImageRef(t, "the packaged chart", rendered, ref)
	})
	t.Run("SHA256SUMS", func(t *testing.T) { checkSums(t, out, len(plugins)) })
	t.Run("kubectl-fence archives and krew manifest", func(t *testing.T) { checkPlugin(t, out, version, commit, plugins) })
	t.Run("SBOMs", func(t *testing.T) {
		checkSBOM(t, root, filepath.Join(out, release.ImageSBOM(version)), version, "sigs.k8s.io/controller-runtime")
		checkSBOM(t, root, filepath.Join(out, release.PluginSBOM(version)), version, "github.com/spf13/cobra")
	})
	t.Run("release notes", func(t *testing.T) {
		notes := string(mustRead(t, filepath.Join(out, release.ReleaseNotes)))
		want, err := release.ChangelogSection(filepath.Join(root, "CHANGELOG.md"), version)
		if err != nil || notes != want || !strings.HasPrefix(notes, "## [") || !strings.Contains(notes, version) {
			t.Errorf("release-notes.md is not CHANGELOG.md's %s section (%v):\n%s", version, err, notes)
		}
	})
}

// makeRelease runs make release into out, without a VERSION from the
// environment; it returns make's combined output.
func makeRelease(root, out string, args ...string) (string, error) {
	cmd := exec.Command("make", append([]string{"--no-print-directory", "release", "RELEASE_DIR=" + out}, args...)...)
	cmd.Dir = root
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "VERSION=") })
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	return buf.String(), err
}

// checkImage loads the OCI archive and checks the index (one image for
// each of images), each platform's config and its one layer; it returns
// the index digest.
func checkImage(t *testing.T, out, version, commit string, images []release.Platform) string {
	t.Helper()
	dir := t.TempDir()
	untar(t, filepath.Join(out, release.ImageArchive(version)), dir)
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("the image archive is not an OCI layout: %v", err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index.json: want one entry (the multi-arch index), got %+v (%v)", im, err)
	}
	if name := im.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; name != version {
		t.Errorf("index.json's ref.name = %q, want %s (skopeo's oci-archive:<file>:<ref>)", name, version)
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		t.Fatalf("the layout's entry is not an image index: %v", err)
	}
	manifest, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, desc := range manifest.Manifests {
		if desc.Platform == nil {
			t.Fatalf("manifest %s has no platform", desc.Digest)
		}
		platforms = append(platforms, desc.Platform.OS+"/"+desc.Platform.Architecture)
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		t.Run("image "+desc.Platform.Architecture, func(t *testing.T) { checkPlatformImage(t, img, *desc.Platform, version, commit) })
	}
	var want []string
	for _, p := range images {
		want = append(want, p.String())
	}
	slices.Sort(platforms)
	if slices.Sort(want); !slices.Equal(platforms, want) {
		t.Errorf("index platforms = %v, want %v", platforms, want)
	}
	if err := layoutValid(idx); err != nil {
		t.Error(err)
	}
	t.Run("a push keeps the digest", func(t *testing.T) { checkPush(t, idx, im.Manifests[0].Digest, version, images) })
	return im.Manifests[0].Digest.String()
}

// checkPush pushes the index to an in-memory registry on loopback (what
// crane push does with the unpacked layout) and pulls it back by tag: the
// registry must serve the digest install.yaml pins, and each platform.
func checkPush(t *testing.T, idx v1.ImageIndex, want v1.Hash, version string, images []release.Platform) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/fencekeeper/manager:"+version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("pushing the index: %v", err)
	}
	pulled, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := pulled.Digest(); got != want {
		t.Errorf("the registry serves %s as %s, want %s", ref, got, want)
	}
	for _, p := range images {
		img, err := remote.Image(ref, remote.WithPlatform(v1.Platform{OS: p.OS, Architecture: p.Arch}))
		if err != nil {
			t.Errorf("pulling %s: %v", p, err)
			continue
		}
		if cf, err := img.ConfigFile(); err != nil || cf.OS != p.OS || cf.Architecture != p.Arch {
			t.Errorf("pulling %s gave %v (%v)", p, cf, err)
		}
	}
}

// layoutValid recomputes the index digest from its manifest (what a
// registry checks on push).
func layoutValid(idx v1.ImageIndex) error {
	raw, err := idx.RawManifest()
	if err != nil {
		return err
	}
	h, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	if d, _ := idx.Digest(); d != h {
		return fmt.Errorf("index digest %s is not the sha256 of its manifest (%s)", d, h)
	}
	return nil
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func checkPlatformImage(t *testing.T, img v1.Image, p v1.Platform, version, commit string) {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("config says %s/%s, the index %s/%s", cf.OS, cf.Architecture, p.OS, p.Architecture)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user = %q, want 65532:65532 (nonroot)", cf.Config.User)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/manager"}) {
		t.Errorf("entrypoint = %v, want [/manager]", cf.Config.Entrypoint)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.title":    "fencekeeper-manager",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.source":   "https://github.com/fencekeeper/fencekeeper",
	} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if rev := cf.Config.Labels["org.opencontainers.image.revision"]; rev != commit {
		t.Errorf("label org.opencontainers.image.revision = %q, want the commit %s", rev, commit)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("want one layer, got %d (%v)", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	files := readTar(t, rc)
	if !strings.Contains(string(files["etc/passwd"].body), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot entry for 65532: %q", files["etc/passwd"].body)
	}
	manager, ok := files["manager"]
	if !ok {
		t.Fatalf("the layer has no /manager; it has %v", slices.Sorted(maps.Keys(files)))
	}
	if manager.mode&0o111 == 0 {
		t.Errorf("/manager mode %o is not executable", manager.mode)
	}
	checkELF(t, "/manager", manager.body, p.Architecture, commit)
	if p.Architecture == runtime.GOARCH {
		checkRuns(t, manager.body, version, commit)
	}
}

// checkRuns runs the image's manager here (same architecture) with
// --version: it prints the version and commit make release stamped.
func checkRuns(t *testing.T, bin []byte, version, commit string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manager")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), version) || !strings.Contains(string(out), commit) {
		t.Errorf("/manager --version: %v\n%s\nwant %s and %s", err, out, version, commit)
	}
}

// checkELF: a static Linux binary for arch, stamped with the version.
func checkELF(t *testing.T, name string, bin []byte, arch, commit string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s is not an ELF binary: %v", name, err)
	}
	if f.Machine != elfMachine[arch] {
		t.Errorf("%s is for %s, want %s", name, f.Machine, elfMachine[arch])
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s has an interpreter: it is not static (CGO_ENABLED=0)", name)
		}
	}
	checkBuildInfo(t, name, bin, commit)
}

// checkBuildInfo: the binary was built by make release's rules and carries
// the commit that -X stamped into internal/version (Go does not record
// -ldflags in the build info of a -trimpath build).
func checkBuildInfo(t *testing.T, name string, bin []byte, commit string) {
	t.Helper()
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s: no Go build info: %v", name, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s: CGO_ENABLED=%q -trimpath=%q, want 0 and true", name, settings["CGO_ENABLED"], settings["-trimpath"])
	}
	if !bytes.Contains(bin, []byte(commit)) {
		t.Errorf("%s does not carry the commit %s: internal/version is not stamped", name, commit)
	}
}

// checkImageRef: the manager Deployment in a rendered manifest runs ref.
func checkImageRef(t *testing.T, what string, manifest []byte, ref string) {
	t.Helper()
	var images []string
	for _, doc := range strings.Split(string(manifest), "\n---") {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Image string `json:"image"`
						} `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if obj.Kind == "Deployment" {
			for _, c := range obj.Spec.Template.Spec.Containers {
				images = append(images, c.Image)
			}
		}
	}
	if !slices.Equal(images, []string{ref}) {
		t.Errorf("%s runs %v, want exactly [%s] (fully qualified, pinned to the index digest)", what, images, ref)
	}
}

func checkSums(t *testing.T, out string, archives int) {
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(mustRead(t, filepath.Join(out, release.Checksums))))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Errorf("SHA256SUMS line %q is not `<sha256>  <file>`", sc.Text())
			continue
		}
		got, err := release.FileSHA256(filepath.Join(out, name))
		if err != nil || got != sum {
			t.Errorf("SHA256SUMS: %s is %s (%v), the file says %s", name, got, err, sum)
		}
		listed[name] = true
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != release.Checksums && !listed[e.Name()] {
			t.Errorf("SHA256SUMS does not list %s", e.Name())
		}
	}
	if want := 7 + archives; len(listed) != want {
		t.Errorf("SHA256SUMS lists %d files; want %d (image, install.yaml, chart, %d plugin archives, krew manifest, 2 SBOMs, notes)", len(listed), want, archives)
	}
}

// krewManifest is what krew reads of the rendered manifest.
type krewManifest struct {
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// checkPlugin checks the krew manifest and the archives: one for each of
// plugins, and none for another platform.
func checkPlugin(t *testing.T, out, version, commit string, plugins []release.Platform) {
	var m krewManifest
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(out, release.KrewManifest)), &m); err != nil {
		t.Fatalf("fence.yaml: %v", err)
	}
	if m.Spec.Version != version {
		t.Errorf("krew spec.version = %q, want %s", m.Spec.Version, version)
	}
	seen := map[release.Platform]bool{}
	for _, pl := range m.Spec.Platforms {
		p := release.Platform{OS: pl.Selector.MatchLabels["os"], Arch: pl.Selector.MatchLabels["arch"]}
		seen[p] = true
		archive := release.PluginArchive(version, p)
		wantURI := "https://github.com/fencekeeper/fencekeeper/releases/download/" + version + "/" + archive
		if pl.URI != wantURI {
			t.Errorf("krew %s: uri %s, want %s", p, pl.URI, wantURI)
		}
		sum, err := release.FileSHA256(filepath.Join(out, archive))
		if err != nil || pl.SHA256 != sum {
			t.Errorf("krew %s: sha256 %s, the archive's is %s (%v)", p, pl.SHA256, sum, err)
			continue
		}
		files := archiveFiles(t, filepath.Join(out, archive))
		if _, ok := files[pl.Bin]; !ok {
			t.Errorf("%s has no %s (krew's bin); it has %v", archive, pl.Bin, slices.Sorted(maps.Keys(files)))
			continue
		}
		if !bytes.Contains(files["LICENSE"], []byte("Apache License")) {
			t.Errorf("%s has no LICENSE", archive)
		}
		checkPluginBinary(t, archive, files[pl.Bin], p, commit)
	}
	for _, p := range release.PluginPlatforms {
		_, err := os.Stat(filepath.Join(out, release.PluginArchive(version, p)))
		switch want := slices.Contains(plugins, p); {
		case want && !seen[p]:
			t.Errorf("krew manifest has no platform %s", p)
		case !want && seen[p]:
			t.Errorf("krew manifest has platform %s, which RELEASE_PLATFORMS leaves out", p)
		case !want && err == nil:
			t.Errorf("the release has an archive for %s, which RELEASE_PLATFORMS leaves out", p)
		}
	}
}

// checkPluginBinary: the binary in the archive is for the archive's platform.
func checkPluginBinary(t *testing.T, archive string, bin []byte, p release.Platform, commit string) {
	t.Helper()
	r := bytes.NewReader(bin)
	switch p.OS {
	case "linux":
		checkELF(t, archive, bin, p.Arch, commit)
		return
	case "darwin":
		f, err := macho.NewFile(r)
		want := map[string]macho.Cpu{"amd64": macho.CpuAmd64, "arm64": macho.CpuArm64}[p.Arch]
		if err != nil || f.Cpu != want {
			t.Errorf("%s: not a Mach-O binary for %s (%v)", archive, want, err)
		}
	case "windows":
		f, err := pe.NewFile(r)
		want := map[string]uint16{"amd64": pe.IMAGE_FILE_MACHINE_AMD64, "arm64": pe.IMAGE_FILE_MACHINE_ARM64}[p.Arch]
		if err != nil || f.Machine != want {
			t.Errorf("%s: not a PE binary for machine %#x (%v)", archive, want, err)
		}
	}
	checkBuildInfo(t, archive, bin, commit)
}

// bom is what the test reads of a CycloneDX document.
type bom struct {
	BOMFormat   string `json:"bomFormat"`
	SpecVersion string `json:"specVersion"`
	Metadata    struct {
		Component struct {
			Version    string             `json:"version"`
			Properties []release.Property `json:"properties"`
		} `json:"component"`
	} `json:"metadata"`
	Components []release.Component `json:"components"`
}

// checkSBOM: every module of the SBOM is the one go.mod selects, with
// go.sum's hash; the standard library and mustList are among them.
func checkSBOM(t *testing.T, root, path, version, mustList string) {
	var b bom
	if err := json.Unmarshal(mustRead(t, path), &b); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	name := filepath.Base(path)
	if b.BOMFormat != "CycloneDX" || b.SpecVersion != "1.5" || b.Metadata.Component.Version != version {
		t.Errorf("%s: bomFormat %q specVersion %q version %q", name, b.BOMFormat, b.SpecVersion, b.Metadata.Component.Version)
	}
	selected := goModules(t, root)
	listed := map[string]bool{}
	for _, c := range b.Components {
		listed[c.Name] = true
		if c.Name == "stdlib" {
			if !strings.HasPrefix(c.PURL, "pkg:golang/stdlib@1.") {
				t.Errorf("%s: stdlib purl %s", name, c.PURL)
			}
			continue
		}
		want, ok := selected[c.Name]
		if !ok || c.Version != want.Version {
			t.Errorf("%s: %s %s, but go.mod selects %q", name, c.Name, c.Version, want.Version)
		}
		if len(c.Hashes) != 1 || c.Hashes[0].Alg != "SHA-256" || len(c.Hashes[0].Content) != 64 || !slices.Contains(c.Properties, release.Property{Name: "go.sum", Value: want.Sum}) {
			t.Errorf("%s: %s@%s hashes %v properties %v, want go.sum's %s", name, c.Name, c.Version, c.Hashes, c.Properties, want.Sum)
		}
	}
	for _, m := range []string{"stdlib", mustList, "k8s.io/client-go"} {
		if !listed[m] {
			t.Errorf("%s does not list %s", name, m)
		}
	}
	if len(b.Components) < 20 {
		t.Errorf("%s lists %d components; the binaries link far more modules", name, len(b.Components))
	}
}

type goModule struct{ Version, Sum string }

// goModules is what `go list -m all` selects, with go.sum's hashes.
func goModules(t *testing.T, root string) map[string]goModule {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-json", "all")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	mods := map[string]goModule{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m struct{ Path, Version, Sum string }
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		mods[m.Path] = goModule{m.Version, m.Sum}
	}
	return mods
}

type tarFile struct {
	mode int64
	body []byte
}

func readTar(t *testing.T, r io.Reader) map[string]tarFile {
	t.Helper()
	files := map[string]tarFile{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(hdr.Name, "./")] = tarFile{hdr.Mode, body}
	}
}

// archiveFiles reads a .tar.gz or .zip.
func archiveFiles(t *testing.T, path string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	if strings.HasSuffix(path, ".zip") {
		zr, err := zip.OpenReader(path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = zr.Close() }()
		for _, f := range zr.File {
			rc, err := f.Open()
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(rc)
			_ = rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			files[f.Name] = body
		}
		return files
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for name, tf := range readTar(t, gz) {
		files[name] = tf.body
	}
	return files
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for name, tf := range readTar(t, f) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			t.Fatalf("archive entry %q leaves the directory", name)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, tf.body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// run runs a command in dir and returns its stdout.
func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return out
}

// repoRoot is the module's root: this package is test/release.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod two levels up from test/release: %v", err)
	}
	return root
}

func chartAppVersion(t *testing.T, root string) string {
	t.Helper()
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(root, "dist", "chart", "Chart.yaml")), &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("dist/chart/Chart.yaml: no appVersion (%v)", err)
	}
	return chart.AppVersion
}
