package chaos

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestChaosSmoke is make chaos cut down for make test: one 30-second
// schedule (every kind of fault but the ones that do not fit) on the real
// replicated control plane, through the command users run. It fails on any
// violation, and when the run proves nothing (no fault applied, no write
// acknowledged, no adversary write tried).
func TestChaosSmoke(t *testing.T) {
	root, err := localcp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "chaos")
	build := exec.Command("go", "build", "-o", bin, "./test/chaos/cmd/chaos")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./test/chaos/cmd/chaos: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "-schedules=1", "-length=30s", "-seed=20261202", "-net="+strconv.Itoa(os.Getpid()%20+1))
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &stdout, &stderr
	err = cmd.Run()
	t.Logf("stdout:\n%s", stdout.String())
	if err != nil {
		// CI shows only the tail of the log: name the violations here.
		t.Fatalf("chaos: %v\n%sstderr (tail):\n%s", err, violations(stdout.String()), tail(stderr.Bytes(), 4000))
	}
	out := stdout.String()
	for _, want := range []string{"PASS: every invariant held", "stale writes tried", "replay writes tried"} {
		if !bytes.Contains(stdout.Bytes(), []byte(want)) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if n := count(t, out, `writes ok\s+(\d+)`); n < 20 {
		t.Errorf("only %d writes acknowledged: the schedule proves little", n)
	}
	if n := count(t, out, `store commits ok\s+(\d+)`); n < 5 {
		t.Errorf("only %d store commits acknowledged: the schedule proves little about the store", n)
	}
	faults := 0
	for _, m := range regexp.MustCompile(`(?m)^  (?:partition|kill|pause|delay|skew).{0,60}?\s{2,}(\d+)(?:\s|$)`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		faults += n
	}
	if faults < 2 {
		t.Errorf("%d faults applied, want at least 2", faults)
	}
}

func count(t *testing.T, out, pattern string) int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("the report lacks %s", pattern)
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// violations picks out of a chaos report the nonzero VIOLATIONS lines with
// the details under them, and the "trace of" blocks.
func violations(out string) string {
	var b strings.Builder
	keep := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "  VIOLATIONS "):
			keep = !strings.HasSuffix(l, " 0")
		case strings.HasPrefix(l, "trace of "):
			keep = true
		case keep && strings.HasPrefix(l, "  "):
		default:
			keep = false
		}
		if keep {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
