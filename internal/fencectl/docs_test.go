package fencectl

import (
	"io"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

const docsPage = "../../docs/kubectl-fence.md"

// outputFlags are kubectl's output flags (addOutputFlags), documented once
// under "Output formats".
var outputFlags = map[string]bool{"output": true, "template": true, "allow-missing-template-keys": true, "show-managed-fields": true}

// docSections splits the page into its sections by heading text (without
// the #s); a section runs to the next heading of any level.
func docSections(t *testing.T) (map[string]string, string) {
	t.Helper()
	raw, err := os.ReadFile(docsPage)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	heading, inFence := "", false
	var body strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(line, "#") {
			sections[heading] = body.String()
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
			body.Reset()
			continue
		}
		body.WriteString(line + "\n")
	}
	sections[heading] = body.String()
	return sections, string(raw)
}

// TestDocsCoverEveryCommand walks the command tree: every command has a
// section in docs/kubectl-fence.md headed with its usage line (the parent's
// path, then Use: "### write LOCKGRANT -f FILE", "### keys status"), and
// every flag of it is named in that section; the connection flags are named
// under "Connection flags (kubectl's)" and the output flags under "Output
// formats".
func TestDocsCoverEveryCommand(t *testing.T) {
	sections, _ := docSections(t)
	root := newRoot(io.Discard, io.Discard)
	mention := func(f *pflag.Flag) string {
		if f.Shorthand != "" {
			return "-" + f.Shorthand + ", --" + f.Name
		}
		return "--" + f.Name
	}
	connection, ok := sections["Connection flags (kubectl's)"]
	if !ok {
		t.Fatalf("%s has no section \"Connection flags (kubectl's)\"", docsPage)
	}
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if want := mention(f); !strings.Contains(connection, want) {
			t.Errorf("connection flag %s is not in %s, section \"Connection flags (kubectl's)\" (want %q there)", f.Name, docsPage, want)
		}
	})
	output := sections["Output formats"]
	for _, c := range commands(root)[1:] {
		heading := strings.TrimPrefix(c.Parent().CommandPath()+" "+c.Use, root.CommandPath()+" ")
		body, ok := sections[heading]
		if !ok {
			t.Errorf("%s has no section \"### %s\" for %s", docsPage, heading, c.CommandPath())
			continue
		}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			in, where := body, heading
			if outputFlags[f.Name] {
				in, where = output, "Output formats"
			}
			if want := mention(f); !strings.Contains(in, want) {
				t.Errorf("%s: flag --%s is not in %s, section %q (want %q there)", c.CommandPath(), f.Name, docsPage, where, want)
			}
		})
	}
}

// TestDocsExamplesParse: every kubectl fence command line in the page's sh
// blocks parses as the plugin would run it.
func TestDocsExamplesParse(t *testing.T) {
	_, page := docSections(t)
	var block strings.Builder
	inSh, n := false, 0
	for _, line := range strings.Split(page, "\n") {
		switch {
		case !inSh && strings.HasPrefix(line, "```sh"):
			inSh = true
			block.Reset()
		case inSh && strings.HasPrefix(line, "```"):
			inSh = false
			runs, err := invocations(block.String())
			if err != nil {
				t.Error(err)
			}
			for _, args := range runs {
				n++
				if _, err := checkInvocation(args); err != nil {
					t.Errorf("%s: %q: %v", docsPage, strings.Join(args, " "), err)
				}
			}
		case inSh:
			block.WriteString(line + "\n")
		}
	}
	if n < 10 {
		t.Fatalf("only %d kubectl fence command lines found in %s's sh blocks", n, docsPage)
	}
}
