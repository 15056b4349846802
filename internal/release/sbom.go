package release

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// CycloneDX 1.5 JSON, the part an SBOM of Go binaries needs. Everything
// comes from the build info Go embeds in each binary (debug/buildinfo):
// what was linked, at which version, with which go.sum hash.
type (
	// BOM is a CycloneDX document.
	BOM struct {
		BOMFormat    string       `json:"bomFormat"`
		SpecVersion  string       `json:"specVersion"`
		SerialNumber string       `json:"serialNumber"`
		Version      int          `json:"version"`
		Metadata     BOMMetadata  `json:"metadata"`
		Components   []Component  `json:"components"`
		Dependencies []Dependency `json:"dependencies"`
	}
	// BOMMetadata says what the BOM describes.
	BOMMetadata struct {
		Timestamp string    `json:"timestamp"`
		Component Component `json:"component"`
	}
	// Component is the described artifact or one Go module it links.
	Component struct {
		BOMRef     string     `json:"bom-ref"`
		Type       string     `json:"type"`
		Name       string     `json:"name"`
		Version    string     `json:"version"`
		PURL       string     `json:"purl,omitempty"`
		Hashes     []Hash     `json:"hashes,omitempty"`
		Properties []Property `json:"properties,omitempty"`
	}
	// Hash is a content hash, hex.
	Hash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	// Property is a name/value pair.
	Property struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	// Dependency lists what a component depends on.
	Dependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// writeSBOM writes the SBOM of one artifact built from binaries (one per
// platform, so a module linked on one platform only is listed too).
func (c *Config) writeSBOM(out, kind, name string, binaries []string) error {
	bom, err := c.sbom(kind, name, binaries)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(data, '\n'), 0o644)
}

func (c *Config) sbom(kind, name string, binaries []string) (*BOM, error) {
	mods := map[string]Component{}
	var goVersion, mainPath string
	var platforms []string
	for _, bin := range binaries {
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			return nil, fmt.Errorf("%s: no Go build info: %w", bin, err)
		}
		goVersion, mainPath = bi.GoVersion, bi.Path
		platforms = append(platforms, setting(bi, "GOOS")+"/"+setting(bi, "GOARCH"))
		for _, dep := range bi.Deps {
			comp, err := moduleComponent(dep)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", bin, err)
			}
			mods[comp.BOMRef] = comp
		}
	}
	// The standard library as vulnerability scanners name it.
	std := "pkg:golang/stdlib@" + strings.TrimPrefix(goVersion, "go")
	mods[std] = Component{BOMRef: std, Type: "library", Name: "stdlib", Version: goVersion, PURL: std}
	ref := goPURL(mainPath, c.Version)
	bom := &BOM{
		BOMFormat: "CycloneDX", SpecVersion: "1.5", Version: 1,
		Metadata: BOMMetadata{Timestamp: c.Created.UTC().Format(time.RFC3339), Component: Component{
			BOMRef: ref, Type: kind, Name: name, Version: c.Version, PURL: ref,
			Properties: []Property{
				{Name: "go.package", Value: mainPath},
				{Name: "go.version", Value: goVersion},
				{Name: "vcs.revision", Value: c.Commit},
				{Name: "platforms", Value: strings.Join(platforms, ",")},
			},
		}},
	}
	deps := Dependency{Ref: ref, DependsOn: []string{}}
	for _, k := range slices.Sorted(maps.Keys(mods)) {
		bom.Components = append(bom.Components, mods[k])
		deps.DependsOn = append(deps.DependsOn, k)
	}
	bom.Dependencies = []Dependency{deps}
	bom.SerialNumber = serialNumber(bom)
	return bom, nil
}

// moduleComponent is one linked module; a replaced module is listed as its
// replacement (what was compiled), with the original named in a property.
func moduleComponent(dep *debug.Module) (Component, error) {
	m, replaced := dep, ""
	if dep.Replace != nil {
		m, replaced = dep.Replace, dep.Path
	}
	ref := goPURL(m.Path, m.Version)
	comp := Component{BOMRef: ref, Type: "library", Name: m.Path, Version: m.Version, PURL: ref}
	if m.Sum != "" {
		hexSum, err := h1Hex(m.Sum)
		if err != nil {
			return Component{}, fmt.Errorf("module %s@%s: %w", m.Path, m.Version, err)
		}
		comp.Hashes = []Hash{{Alg: "SHA-256", Content: hexSum}}
		comp.Properties = append(comp.Properties, Property{Name: "go.sum", Value: m.Sum})
	}
	if replaced != "" {
		comp.Properties = append(comp.Properties, Property{Name: "go.replaces", Value: replaced})
	}
	return comp, nil
}

// h1Hex turns go.sum's "h1:<base64 sha256>" into hex, the form CycloneDX
// hashes take.
func h1Hex(sum string) (string, error) {
	b64, ok := strings.CutPrefix(sum, "h1:")
	if !ok {
		return "", fmt.Errorf("hash %q is not go.sum's h1: form", sum)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != sha256.Size {
		return "", fmt.Errorf("hash %q is not a base64 sha256", sum)
	}
	return hex.EncodeToString(raw), nil
}

func goPURL(path, version string) string {
	return "pkg:golang/" + path + "@" + version + "?type=module"
}

func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// serialNumber is a UUID derived from the BOM's content (a version 5 style
// UUID over its JSON), so the same build gives the same document.
func serialNumber(bom *BOM) string {
	data, _ := json.Marshal(bom)
	sum := sha256.Sum256(data)
	u := sum[:16]
	u[6] = (u[6] & 0x0f) | 0x50
	u[8] = (u[8] & 0x3f) | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
