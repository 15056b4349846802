package fencectl

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
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
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// renderKrew fills the placeholders as the release does.
func renderKrew(t *testing.T, tag string) krewPlugin {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "plugins", "krew", "fence.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), "{{ .TagName }}", tag)
	text = regexp.MustCompile(`SHA256_[A-Z0-9]+_[A-Z0-9]+`).ReplaceAllString(text, strings.Repeat("ab", 32))
	if strings.Contains(text, "{{") {
		t.Fatalf("placeholder left after rendering: %s", text)
	}
	var p krewPlugin
	if err := yaml.Unmarshal([]byte(text), &p); err != nil {
		t.Fatalf("fence.yaml is not valid YAML: %v", err)
	}
	return p
}

func TestKrewManifest(t *testing.T) {
	const tag = "v1.2.3"
	p := renderKrew(t, tag)
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" {
		t.Errorf("apiVersion/kind = %s/%s, want krew.googlecontainertools.github.com/v1alpha2/Plugin", p.APIVersion, p.Kind)
	}
	if p.Metadata.Name != "fence" {
		t.Errorf("metadata.name = %q, want fence (the plugin is kubectl fence)", p.Metadata.Name)
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
	want := map[string]bool{"linux/amd64": false, "linux/arm64": false, "darwin/amd64": false, "darwin/arm64": false}
	hex64 := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, pl := range p.Spec.Platforms {
		goos, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		key := goos + "/" + arch
		seen, known := want[key]
		if !known || seen {
			t.Errorf("platform %s: unexpected or repeated", key)
			continue
		}
		want[key] = true
		u, err := url.Parse(pl.URI)
		if err != nil || u.Scheme != "https" {
			t.Errorf("platform %s: uri %q is not an https URL", key, pl.URI)
		}
		archive := fmt.Sprintf("/releases/download/%s/kubectl-fence_%s_%s_%s.tar.gz", tag, tag, goos, arch)
		if !strings.HasSuffix(pl.URI, archive) {
			t.Errorf("platform %s: uri %q does not end with %s", key, pl.URI, archive)
		}
		if !hex64.MatchString(pl.SHA256) {
			t.Errorf("platform %s: sha256 %q is not 64 hex digits after the release fills it", key, pl.SHA256)
		}
		if pl.Bin != "kubectl-fence" {
			t.Errorf("platform %s: bin = %q, want kubectl-fence", key, pl.Bin)
		}
		files := map[string]bool{}
		for _, f := range pl.Files {
			files[f.From] = true
		}
		for _, f := range []string{"kubectl-fence", "kubectl_complete-fence", "LICENSE"} {
			if !files[f] {
				t.Errorf("platform %s: archive file %s is not installed", key, f)
			}
		}
	}
	for key, seen := range want {
		if !seen {
			t.Errorf("platform %s missing", key)
		}
	}
}
