package release

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// heading is a Keep a Changelog version heading: "## [v0.1.0] - 2026-12-04"
// (brackets, the v and the date optional).
var heading = regexp.MustCompile(`^## \[?v?([^\]\s]+)\]?(\s+-\s+.*)?$`)

// ChangelogSection returns the section of CHANGELOG.md for version (the
// heading and its text, up to the next version heading or the link
// references at the end). A version without one, or with an empty one, is
// an error: a release says what it changes.
func ChangelogSection(path, version string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the changelog: %w", err)
	}
	want := strings.TrimPrefix(version, "v")
	var section []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			if in {
				break
			}
			in = m[1] == want
		} else if in && strings.HasPrefix(line, "[") && strings.Contains(line, "]: ") {
			break // link reference definitions close the file
		}
		if in {
			section = append(section, line)
		}
	}
	if len(section) == 0 {
		return "", fmt.Errorf("%s has no section for %s: add `## [%s] - <date>` with what the release changes (Keep a Changelog, docs/releasing.md)", path, version, version)
	}
	text := strings.TrimSpace(strings.Join(section, "\n"))
	if !strings.Contains(text, "\n") {
		return "", fmt.Errorf("%s: the section for %s is empty: say what the release changes", path, version)
	}
	return text + "\n", nil
}
