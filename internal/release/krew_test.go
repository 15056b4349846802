package release

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// krewPlugin is the part of krew's v1alpha2 Plugin the index validates.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI   string `json:"uri"`
			SHA   string `json:"sha256"`
			Files []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestKrewManifest renders plugins/krew/fence.yaml as make release does,
// over stand-in archives, and checks what krew-index requires: every
// platform's URL is the release's archive and its sha256 is that file's.
func TestKrewManifest(t *testing.T) {
	const tag = "v1.2.3"
	dir := t.TempDir()
	sums := map[string]string{}
	for _, p := range PluginPlatforms {
		name := PluginArchive(tag, p)
		if err := os.WriteFile(filepath.Join(dir, name), []byte("archive for "+p.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		sum, err := FileSHA256(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		sums[p.String()] = sum
	}
	out, err := RenderKrew(filepath.Join("..", "..", "plugins", "krew", "fence.yaml"), tag, dir, PluginPlatforms)
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(out, &p); err != nil {
		t.Fatalf("the rendered manifest: %v\n%s", err, out)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "fence" {
		t.Errorf("apiVersion/kind/name = %s/%s/%s, want krew.googlecontainertools.github.com/v1alpha2/Plugin/fence", p.APIVersion, p.Kind, p.Metadata.Name)
	}
	if p.Spec.Version != tag {
		t.Errorf("spec.version = %q, want the release tag %q", p.Spec.Version, tag)
	}
	if p.Spec.Homepage == "" || p.Spec.ShortDescription == "" || p.Spec.Description == "" {
		t.Error("homepage, shortDescription and description are required by krew-index")
	}
	if len(p.Spec.ShortDescription) > 50 {
		t.Errorf("shortDescription is %d characters; krew-index wants it short (≤ 50)", len(p.Spec.ShortDescription))
	}
	seen := map[string]bool{}
	for _, pl := range p.Spec.Platforms {
		plat := Platform{OS: pl.Selector.MatchLabels["os"], Arch: pl.Selector.MatchLabels["arch"]}
		key := plat.String()
		if _, known := sums[key]; !known || seen[key] {
			t.Errorf("platform %s: unexpected or repeated", key)
			continue
		}
		seen[key] = true
		u, err := url.Parse(pl.URI)
		want := fmt.Sprintf("/fencekeeper/fencekeeper/releases/download/%s/%s", tag, PluginArchive(tag, plat))
		if err != nil || u.Scheme != "https" || u.Host != "github.com" || u.Path != want {
			t.Errorf("platform %s: uri %q, want https://github.com%s", key, pl.URI, want)
		}
		if pl.SHA != sums[key] {
			t.Errorf("platform %s: sha256 %q, want the archive's %s", key, pl.SHA, sums[key])
		}
		bin, files := "kubectl-fence", []string{"kubectl-fence", "kubectl_complete-fence", "LICENSE"}
		if plat.OS == "windows" {
			bin, files = "kubectl-fence.exe", []string{"kubectl-fence.exe", "LICENSE"}
		}
		if pl.Bin != bin {
			t.Errorf("platform %s: bin = %q, want %s", key, pl.Bin, bin)
		}
		var from []string
		for _, f := range pl.Files {
			from = append(from, f.From)
		}
		if strings.Join(from, ",") != strings.Join(files, ",") {
			t.Errorf("platform %s: installs %v, want %v (what its archive holds)", key, from, files)
		}
	}
	if len(seen) != len(PluginPlatforms) {
		t.Errorf("platforms %v, want all of %v", seen, PluginPlatforms)
	}
}

// TestKrewManifestNamesOnlyBuiltArchives: an archive the release did not
// build fails the render, naming it.
func TestKrewManifestNamesOnlyBuiltArchives(t *testing.T) {
	_, err := RenderKrew(filepath.Join("..", "..", "plugins", "krew", "fence.yaml"), "v1.2.3", t.TempDir(), PluginPlatforms)
	if err == nil || !strings.Contains(err.Error(), "kubectl-fence_v1.2.3_linux_amd64.tar.gz, which the release did not build") {
		t.Errorf("rendering without archives: %v, want an error naming the missing archive", err)
	}
}

// TestKrewManifestOfFewerPlatforms: a release of some plugin platforms
// (make test's) renders their entries as a whole release does and no
// other; the whole list leaves the template as it is.
func TestKrewManifestOfFewerPlatforms(t *testing.T) {
	template := filepath.Join("..", "..", "plugins", "krew", "fence.yaml")
	raw, err := os.ReadFile(template)
	if err != nil {
		t.Fatal(err)
	}
	if all, err := keepPlatforms(raw, PluginPlatforms); err != nil || !bytes.Equal(all, raw) {
		t.Fatalf("keeping every platform changed the template (%v):\n%s", err, all)
	}
	const tag = "v1.2.3"
	dir := t.TempDir()
	for _, p := range PluginPlatforms {
		if err := os.WriteFile(filepath.Join(dir, PluginArchive(tag, p)), []byte(p.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	whole, err := RenderKrew(template, tag, dir, PluginPlatforms)
	if err != nil {
		t.Fatal(err)
	}
	linux := []Platform{{"linux", "amd64"}, {"linux", "arm64"}}
	part, err := RenderKrew(template, tag, dir, linux)
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(part, &p); err != nil {
		t.Fatalf("the rendered manifest: %v\n%s", err, part)
	}
	var got []Platform
	for _, pl := range p.Spec.Platforms {
		got = append(got, Platform{pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]})
	}
	if !slices.Equal(got, linux) {
		t.Errorf("platforms %v, want %v", got, linux)
	}
	darwin := bytes.Index(whole, []byte("  - selector:\n      matchLabels:\n        os: darwin"))
	if darwin < 0 || !bytes.Equal(part, whole[:darwin]) {
		t.Errorf("the linux entries are not the whole release's text up to its first darwin entry:\n%s", part)
	}
}

func TestKrewTemplateShapeIsChecked(t *testing.T) {
	entry := func(os, arch string) string {
		return "  - selector:\n      matchLabels:\n        os: " + os + "\n        arch: " + arch + "\n    bin: kubectl-fence\n"
	}
	linux := []Platform{{"linux", "amd64"}}
	for _, tc := range []struct{ template, want string }{
		{"spec:\n  version: x\n", "no spec.platforms list"},
		{"spec:\n  platforms:\n" + entry("linux", "amd64") + "  homepage: x\n", `"  homepage: x" follows the platforms list`},
		{"spec:\n  platforms:\n" + entry("linux", "amd64") + entry("linux", "amd64"), "platform linux/amd64 has two entries"},
		{"spec:\n  platforms:\n  - selector:\n    bin: x\n", "names no os and arch"},
		{"spec:\n  platforms:\n" + entry("darwin", "arm64"), "no entry for platform linux/amd64"},
	} {
		if _, err := keepPlatforms([]byte(tc.template), linux); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keepPlatforms(%q) = %v, want %q", tc.template, err, tc.want)
		}
	}
}

func TestParsePlatforms(t *testing.T) {
	for in, want := range map[string]string{
		"":                         "linux/amd64, linux/arm64, darwin/amd64, darwin/arm64, windows/amd64, windows/arm64",
		"linux/arm64, linux/amd64": "linux/amd64, linux/arm64",
		"darwin/arm64":             "darwin/arm64",
		"linux/386":                `platform "linux/386" is not one of linux/amd64, linux/arm64, darwin/amd64`,
		"linux":                    `platform "linux" is not one of`,
		"linux/amd64,,linux/arm64": `platform "" is not one of`,
		"linux/amd64, linux/amd64": "platform linux/amd64 is named twice",
	} {
		ps, err := ParsePlatforms(in, PluginPlatforms)
		got := platformList(ps)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, want) {
			t.Errorf("ParsePlatforms(%q) = %q, want %q", in, got, want)
		}
	}
}
