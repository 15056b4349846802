package fencectl

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// commands is every command of the tree a person can run or ask help for:
// not cobra's help and __complete, nor hidden ones.
func commands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || strings.HasPrefix(c.Name(), cobra.ShellCompRequestCmd) {
			return
		}
		out = append(out, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// invocations are the kubectl fence command lines in text (an Example, or a
// shell block of the docs): each line's words after "kubectl fence" or
// "kubectl-fence", up to the end of the command (a pipe, a redirection, the
// ")" closing a "$(…)"). Comment lines are skipped.
func invocations(text string) ([][]string, error) {
	var out [][]string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i, n := strings.Index(line, "kubectl fence "), len("kubectl fence ")
		if j := strings.Index(line, "kubectl-fence "); j >= 0 && (i < 0 || j < i) {
			i, n = j, len("kubectl-fence ")
		}
		// Only where a command starts: "go build -o ~/bin/kubectl-fence …" runs go.
		if before := strings.TrimSpace(line[:max(i, 0)]); i < 0 || (before != "" && !strings.HasSuffix(before, "(") &&
			!strings.HasSuffix(before, "|") && !strings.HasSuffix(before, ";") && !strings.HasSuffix(before, "&&")) {
			continue
		}
		words, err := shellWords(line[i+n:])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out = append(out, words)
	}
	return out, nil
}

// shellWords splits a command as sh would (single and double quotes, a
// backslash inside double quotes), stopping at an unquoted |, >, <, ;, &, ")"
// or "#".
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
		}
		cur.Reset()
		inWord = false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case strings.IndexByte("|><;&)#", c) >= 0 && !(c == '#' && inWord):
			flush()
			return words, nil
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("unterminated ' at %d", i)
			}
			cur.WriteString(s[i+1 : i+1+end])
			inWord, i = true, i+1+end
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) && strings.IndexByte(`"\$`+"`", s[j+1]) >= 0 {
					j++
				}
				cur.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated \" at %d", i)
			}
			inWord, i = true, j
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, nil
}

// checkInvocation parses args as the plugin would run them, without running
// anything: the command they name, its flags, the number of its arguments,
// -o, and LOCKGRANT and FENCEDRESOURCE names in TYPE/NAME form. It returns
// the command found.
func checkInvocation(args []string) (*cobra.Command, error) {
	root := newRoot(io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil {
		return nil, err
	}
	cmd.InitDefaultHelpFlag()
	if err := cmd.ParseFlags(rest); err != nil {
		return cmd, fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	if help, _ := cmd.Flags().GetBool("help"); help {
		return cmd, nil
	}
	positional := cmd.Flags().Args()
	if err := cmd.ValidateArgs(positional); err != nil {
		return cmd, fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	if err := root.PersistentPreRunE(cmd, positional); err != nil {
		return cmd, fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	names := append([]string(nil), positional...)
	switch {
	case strings.Contains(cmd.Use, "LOCKGRANT"):
		err = lockGrantType.nameArgs(names)
	case strings.Contains(cmd.Use, "FENCEDRESOURCE"):
		err = fencedResourceType.nameArgs(names)
	}
	if err != nil {
		return cmd, fmt.Errorf("%s: %w", cmd.CommandPath(), err)
	}
	return cmd, nil
}

// TestExamples: every command has examples, and each one parses, as the
// command's own: an example that does not parse is worse than none.
func TestExamples(t *testing.T) {
	for _, c := range commands(newRoot(io.Discard, io.Discard)) {
		t.Run(c.CommandPath(), func(t *testing.T) {
			if strings.TrimSpace(c.Example) == "" {
				t.Fatalf("%s has no Example", c.CommandPath())
			}
			runs, err := invocations(c.Example)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) == 0 {
				t.Fatalf("%s: no kubectl fence command line in its Example:\n%s", c.CommandPath(), c.Example)
			}
			own := false
			for _, args := range runs {
				got, err := checkInvocation(args)
				if err != nil {
					t.Errorf("example %q: %v", strings.Join(args, " "), err)
					continue
				}
				// A parent's examples run its subcommands.
				own = own || got.CommandPath() == c.CommandPath() || (!c.Runnable() && strings.HasPrefix(got.CommandPath(), c.CommandPath()+" "))
			}
			if !own {
				t.Errorf("%s: none of its examples runs it:\n%s", c.CommandPath(), c.Example)
			}
		})
	}
}

// TestCheckInvocationRefuses: the check above fails on what would fail at
// run time, so a passing TestExamples means something.
func TestCheckInvocationRefuses(t *testing.T) {
	for _, line := range []string{
		"kubectl fence acquire batch --request-ids x",             // unknown flag
		"kubectl fence renew",                                     // LOCKGRANT missing
		"kubectl fence release a b",                               // one too many
		"kubectl fence status -o xml",                             // no such format
		"kubectl fence audit -o name",                             // audit has no names
		"kubectl fence write fr/batch -f x.yaml",                  // a FencedResource where a LockGrant goes
		"kubectl fence keys rotate --wait --timeout soon",         // not a duration
		"kubectl fence version --client=maybe",                    // not a bool
		`kubectl fence status -o jsonpath='{.holder.owner'`,       // bad template
		"kubectl fence receipts batch --operator-namespace there", // receipts has no such flag
	} {
		runs, err := invocations(line)
		if err != nil || len(runs) != 1 {
			t.Fatalf("%q: %v %v", line, runs, err)
		}
		if _, err := checkInvocation(runs[0]); err == nil {
			t.Errorf("%q passed the check", line)
		}
	}
}

func TestShellWords(t *testing.T) {
	for in, want := range map[string]string{
		`status -A`: "status|-A",
		`status -o jsonpath='{.a} {.b}{"\n"}' | sort`: `status|-o|jsonpath={.a} {.b}{"\n"}`,
		`write "$GRANT" -f batch.yaml`:                "write|$GRANT|-f|batch.yaml",
		`completion bash)`:                            "completion|bash",
		`completion zsh > "${fpath[1]}/_x"`:           "completion|zsh",
		`acquire a -o name)   # lockgrant/…`:          "acquire|a|-o|name",
		`x "a\"b"`:                                    `x|a"b`,
	} {
		got, err := shellWords(in)
		if err != nil || strings.Join(got, "|") != want {
			t.Errorf("shellWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestInvocations: command lines are found where a command starts, not
// where the binary's name is an argument.
func TestInvocations(t *testing.T) {
	runs, err := invocations(`# kubectl fence status (a comment)
go build -o ~/bin/kubectl-fence ./cmd/kubectl-fence
GRANT=$(kubectl fence acquire batch -o name)
source <(kubectl-fence completion bash)
kubectl get cm | kubectl fence audit -A
echo "$(kubectl fence version --client)"`)
	var got []string
	for _, r := range runs {
		got = append(got, strings.Join(r, " "))
	}
	want := "acquire batch -o name|completion bash|audit -A|version --client"
	if err != nil || strings.Join(got, "|") != want {
		t.Errorf("invocations = %q, %v; want %q", got, err, want)
	}
}
