package docs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outsideWords are what a file of the product must not say: a path or a
// document outside the repository (the contract is docs/contract.md), and the
// history of how the product was made (issue numbers, numbered or ordinal
// rounds, work sessions), which no user has. "round-robin", "round trip" and
// a variable named round are fine. The patterns are written so that they do
// not match themselves.
var outsideWords = []*regexp.Regexp{
	regexp.MustCompile(`\.\./shared`),
	regexp.MustCompile(`DESIGN\.md`),
	regexp.MustCompile(`(?i)source[ ]design`),
	regexp.MustCompile(`[Ii]ssues?[ -]#?[0-9]`),
	regexp.MustCompile(`(?i)\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth) round`),
	regexp.MustCompile(`(?i)\bround [0-9]`),
	regexp.MustCompile(`(?i)\b(this|same|previous|earlier|next|last)[ -]session\b`),
}

// selfName is this file: it names the words it looks for.
const selfName = "docs/self_contained_test.go"

// TestSelfContained: no tracked file points outside the repository or tells
// the story of its making; every finding is named file:line.
func TestSelfContained(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("not a git work tree (git ls-files: %v)", err)
	}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(files) < 2 {
		t.Fatalf("git ls-files listed %d files", len(files))
	}
	findings := 0
	for _, file := range files {
		if file == selfName {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("..", file))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree, not committed yet
		}
		if err != nil {
			t.Fatal(err)
		}
		if binary(raw) {
			continue
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, re := range outsideWords {
				if m := re.FindString(line); m != "" {
					findings++
					t.Errorf("%s:%d: %q points outside the repository or at its history: %s", file, i+1, m, strings.TrimSpace(line))
					break
				}
			}
		}
	}
	if findings > 0 {
		t.Logf("%d findings: link docs/contract.md (and its section) instead, or say why in words that stand on their own", findings)
	}
}

// binary is git's test: a NUL byte in the first 8000 bytes.
func binary(raw []byte) bool {
	return bytes.IndexByte(raw[:min(len(raw), 8000)], 0) >= 0
}
