package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// runbookBase is where every runbook_url points: the repository's files on
// GitHub. The chart replaces base+"docs/" with its docsBaseURL value.
const runbookBase = "https://github.com/fencekeeper/fencekeeper/blob/main/"

// repoRoot is the repository this module tests (the replace in go.mod).
const repoRoot = "../.."

// Markdown an anchor is computed from the rendered text of: links and images
// keep their text, code spans their content, emphasis markers go.
var (
	mdImageOrLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	mdCodeSpan    = regexp.MustCompile("`+([^`]*)`+")
	mdHeading     = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	mdFence       = regexp.MustCompile("^ {0,3}(```|~~~)")
)

// githubAnchor is GitHub's anchor for a heading's text: the rendered text
// lower-cased, every character but letters, digits, marks, "-", "_" and
// spaces dropped, each space made a "-".
func githubAnchor(heading string) string {
	text := mdImageOrLink.ReplaceAllString(heading, "$1")
	text = mdCodeSpan.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// githubAnchors lists the anchors of a Markdown file's ATX headings (outside
// fenced code) as GitHub renders them: a repeated anchor gets -1, -2, ...
func githubAnchors(markdown string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	var fence string
	for _, line := range strings.Split(markdown, "\n") {
		if m := mdFence.FindStringSubmatch(line); m != nil {
			switch fence {
			case "":
				fence = m[1]
			case m[1]:
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		m := mdHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := githubAnchor(m[2])
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}

// brokenRunbooks lists the runbook URLs that do not name a heading of a file
// under root: outside runbookBase, no such file, or no such heading.
func brokenRunbooks(root string, urls map[string]string) []string {
	var out []string
	for alert, u := range urls {
		rel, ok := strings.CutPrefix(u, runbookBase)
		if !ok {
			out = append(out, fmt.Sprintf("%s: runbook_url %q is not an absolute link under %s", alert, u, runbookBase))
			continue
		}
		file, anchor, _ := strings.Cut(rel, "#")
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			out = append(out, fmt.Sprintf("%s: runbook_url %s: %v", alert, u, err))
			continue
		}
		if anchor == "" || !githubAnchors(string(data))[anchor] {
			out = append(out, fmt.Sprintf("%s: runbook_url %s: %s has no heading with anchor #%s", alert, u, file, anchor))
		}
	}
	slices.Sort(out)
	return out
}

// TestRunbookURLsResolve: every alert's runbook_url is an absolute link to a
// heading that exists in this repository's docs.
func TestRunbookURLsResolve(t *testing.T) {
	urls := map[string]string{}
	for _, r := range rules(t) {
		if r.Alert != "" {
			urls[r.Alert] = r.Annotations["runbook_url"]
		}
	}
	for _, b := range brokenRunbooks(repoRoot, urls) {
		t.Error(b)
	}
}

// TestGitHubAnchors: the anchors are GitHub's, for headings as the docs write them.
func TestGitHubAnchors(t *testing.T) {
	md := strings.Join([]string{
		"# Monitoring",
		"### FencekeeperWebhookSlow, FencekeeperAdmissionDecisionSlow",
		"### Unresolved mutations (`ReconciliationRequired`)",
		"## The operator namespace: a ValidatingAdmissionPolicy",
		"## From a chart that had a crds/ directory ##",
		"## Protected kinds",
		"## Protected kinds",
		"## See [security.md](security.md#x) and *this*",
		"```sh",
		"# not a heading",
		"```",
		"#not-a-heading-either",
	}, "\n")
	got := githubAnchors(md)
	want := []string{"monitoring", "fencekeeperwebhookslow-fencekeeperadmissiondecisionslow", "unresolved-mutations-reconciliationrequired",
		"the-operator-namespace-a-validatingadmissionpolicy", "from-a-chart-that-had-a-crds-directory", "protected-kinds", "protected-kinds-1",
		"see-securitymd-and-this"}
	for _, w := range want {
		if !got[w] {
			t.Errorf("no anchor %q in %v", w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("anchors %v, want exactly %v", got, want)
	}
	// And the check finds what is wrong: a missing heading, a relative link, a missing file.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "docs", "m.md"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := brokenRunbooks(dir, map[string]string{
		"Good":     runbookBase + "docs/m.md#protected-kinds-1",
		"Combined": runbookBase + "docs/m.md#fencekeeperwebhookslow",
		"Relative": "docs/m.md#monitoring",
		"NoFile":   runbookBase + "docs/gone.md#monitoring",
		"NoAnchor": runbookBase + "docs/m.md",
	})
	if len(broken) != 4 || !strings.HasPrefix(broken[0], "Combined:") || !strings.HasPrefix(broken[1], "NoAnchor:") ||
		!strings.HasPrefix(broken[2], "NoFile:") || !strings.HasPrefix(broken[3], "Relative:") {
		t.Errorf("brokenRunbooks found %q", broken)
	}
}
