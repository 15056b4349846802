package release

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

// PluginArchive is kubectl-fence's archive for a version and platform:
// a tar.gz, a zip for Windows.
func PluginArchive(version string, p Platform) string {
	ext := ".tar.gz"
	if p.OS == "windows" {
		ext = ".zip"
	}
	return fmt.Sprintf("kubectl-fence_%s_%s_%s%s", version, p.OS, p.Arch, ext)
}

// buildPlugin builds kubectl-fence for each plugin platform built, archives each
// with LICENSE (and the completion helper, a shell script, beside the Unix
// binaries), then writes the krew manifest and the plugin SBOM.
func (c *Config) buildPlugin(ctx context.Context, work string) error {
	var binaries []string
	plugins := only(PluginPlatforms, c.Platforms)
	for _, p := range plugins {
		bin, err := c.goBuild(ctx, filepath.Join(work, "kubectl-fence"), "./cmd/kubectl-fence", p)
		if err != nil {
			return err
		}
		binaries = append(binaries, bin)
		files := []archiveFile{
			{name: "LICENSE", path: filepath.Join(c.Root, "LICENSE"), mode: 0o644},
			{name: filepath.Base(bin), path: bin, mode: 0o755},
		}
		out := filepath.Join(c.Out, PluginArchive(c.Version, p))
		if p.OS == "windows" {
			err = writeZip(out, files, c.Created)
		} else {
			files = append(files, archiveFile{name: "kubectl_complete-fence", path: filepath.Join(c.Root, "cmd", "kubectl-fence", "kubectl_complete-fence"), mode: 0o755})
			err = writeTar(out, files, c.Created, true)
		}
		if err != nil {
			return fmt.Errorf("archive for %s: %w", p, err)
		}
	}
	manifest, err := RenderKrew(filepath.Join(c.Root, "plugins", "krew", "fence.yaml"), c.Version, c.Out, plugins)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Out, KrewManifest), manifest, 0o644); err != nil {
		return err
	}
	return c.writeSBOM(filepath.Join(c.Out, PluginSBOM(c.Version)), "application", "kubectl-fence", binaries)
}

// RenderKrew renders the krew manifest template as krew-release-bot does:
// {{ .TagName }} is the tag, and {{ addURIAndSha "<url>" .TagName }} becomes
// the uri and the sha256 of that archive, read from dir (where the release
// wrote it) by the URL's last path element. Only the entries of platforms
// are kept (see keepPlatforms).
func RenderKrew(templatePath, tag, dir string, platforms []Platform) ([]byte, error) {
	raw, err := os.ReadFile(templatePath)
	if err != nil {
		return nil, err
	}
	if raw, err = keepPlatforms(raw, platforms); err != nil {
		return nil, fmt.Errorf("%s: %w", templatePath, err)
	}
	funcs := template.FuncMap{"addURIAndSha": func(url, tag string) (string, error) {
		url = strings.ReplaceAll(url, "{{ .TagName }}", tag)
		sum, err := FileSHA256(filepath.Join(dir, path.Base(url)))
		if err != nil {
			return "", fmt.Errorf("krew manifest names %s, which the release did not build: %w", url, err)
		}
		return fmt.Sprintf("uri: %s\n    sha256: %s", url, sum), nil
	}}
	t, err := template.New(filepath.Base(templatePath)).Funcs(funcs).Option("missingkey=error").Parse(string(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", templatePath, err)
	}
	var out bytes.Buffer
	if err := t.Execute(&out, struct{ TagName string }{tag}); err != nil {
		return nil, fmt.Errorf("%s: %w", templatePath, err)
	}
	var check map[string]any
	if err := yaml.UnmarshalStrict(out.Bytes(), &check); err != nil {
		return nil, fmt.Errorf("%s renders invalid YAML: %w", templatePath, err)
	}
	return out.Bytes(), nil
}

// platformEntry is where an entry of the template's platforms list starts.
const platformEntry = "  - selector:\n"

var entryPlatform = regexp.MustCompile(`(?m)^ +os: (\S+)\n +arch: (\S+)$`)

// keepPlatforms drops the krew template's platform entries that are not
// in keep, by their text, so that what is kept renders byte for byte as in
// a whole release. The template must end with its platforms list, one
// entry per platform, each naming os then arch, and have an entry for
// every platform kept.
func keepPlatforms(template []byte, keep []Platform) ([]byte, error) {
	head, list, ok := strings.Cut(string(template), "\n  platforms:\n")
	if !ok || !strings.HasPrefix(list, platformEntry) {
		return nil, errors.New("no spec.platforms list of selector entries")
	}
	out := head + "\n  platforms:\n"
	found := map[Platform]bool{}
	for _, entry := range strings.SplitAfter(list, "\n"+platformEntry) {
		entry = strings.TrimPrefix(entry, platformEntry)
		entry = platformEntry + strings.TrimSuffix(entry, platformEntry)
		for _, line := range strings.Split(strings.TrimSuffix(entry, "\n"), "\n") {
			if line != "" && !strings.HasPrefix(line, "    ") && line+"\n" != platformEntry {
				return nil, fmt.Errorf("%q follows the platforms list: it must be the template's last key", line)
			}
		}
		m := entryPlatform.FindStringSubmatch(entry)
		if m == nil {
			return nil, fmt.Errorf("a platforms entry names no os and arch:\n%s", entry)
		}
		p := Platform{m[1], m[2]}
		if found[p] {
			return nil, fmt.Errorf("platform %s has two entries", p)
		}
		found[p] = true
		if slices.Contains(keep, p) {
			out += entry
		}
	}
	for _, p := range keep {
		if !found[p] {
			return nil, fmt.Errorf("no entry for platform %s", p)
		}
	}
	return []byte(out), nil
}
