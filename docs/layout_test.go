package docs

import (
	"bufio"
	"bytes"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fencekeeper/fencekeeper/"

// tier is one row of design.md's layout table.
type tier struct {
	name     string
	packages []string // module-relative paths; "x/..." names x and everything under it
	mayUse   []string // tier names; nil with anything set: every tier
	anything bool
}

// packagePath is a backticked word of the packages column that names a
// package (prose such as `kubectl fence` or `fence.DecideWrite` does not).
var packagePath = regexp.MustCompile("`([a-z0-9][a-z0-9/._-]*)`")

// layoutTable reads the tiers of design.md's "## Layout" table, bottom up.
func layoutTable(t *testing.T) []tier {
	raw, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Layout\n")
	if !ok {
		t.Fatal(`design.md has no "## Layout" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var tiers []tier
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || strings.HasPrefix(line, "|---") || strings.TrimSpace(cells[1]) == "tier" {
			continue
		}
		tr := tier{name: strings.TrimSpace(cells[1])}
		for _, m := range packagePath.FindAllStringSubmatch(cells[2], -1) {
			tr.packages = append(tr.packages, m[1])
		}
		switch use := strings.TrimSpace(cells[3]); use {
		case "anything":
			tr.anything = true
		case "nothing else":
		default:
			for _, name := range strings.Split(use, ",") {
				tr.mayUse = append(tr.mayUse, strings.TrimSpace(name))
			}
		}
		tiers = append(tiers, tr)
	}
	if len(tiers) == 0 {
		t.Fatal("design.md's layout table has no rows")
	}
	return tiers
}

// imports lists every package of the module with the module's packages it
// imports, its tests' imports included.
func imports(t *testing.T) map[string][]string {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(fields[0], module)
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rel, ok := strings.CutPrefix(imp, module); ok && rel != pkg && !slices.Contains(graph[pkg], rel) {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	return graph
}

func (tr tier) names(pkg string) bool {
	for _, p := range tr.packages {
		if base, ok := strings.CutSuffix(p, "/..."); ok && (pkg == base || strings.HasPrefix(pkg, base+"/")) || p == pkg {
			return true
		}
	}
	return false
}

// TestLayout holds the code to design.md's layout table: every package is
// in exactly one tier, every tier may import only tiers below it, and every
// import (tests' included) stays within what its tier may import.
func TestLayout(t *testing.T) {
	tiers := layoutTable(t)
	graph := imports(t)
	checkTable(t, tiers, graph)
	tierOf := placePackages(t, tiers, graph)
	for pkg, deps := range graph {
		from, ok := tierOf[pkg]
		if !ok || from.anything {
			continue
		}
		for _, dep := range deps {
			to, ok := tierOf[dep]
			if ok && to.name != from.name && !slices.Contains(from.mayUse, to.name) {
				t.Errorf("%s (tier %s) imports %s (tier %s); design.md lets %s import only %v", pkg, from.name, dep, to.name, from.name, from.mayUse)
			}
		}
	}
}

// checkTable: each tier names only tiers below it, and only real packages.
func checkTable(t *testing.T, tiers []tier, graph map[string][]string) {
	below := map[string]int{}
	for i, tr := range tiers {
		for _, use := range tr.mayUse {
			if j, ok := below[use]; !ok || j >= i {
				t.Errorf("tier %q may import %q, which is not a tier below it in the table", tr.name, use)
			}
		}
		below[tr.name] = i
		for _, p := range tr.packages {
			if !slices.ContainsFunc(slices.Collect(maps.Keys(graph)), tier{packages: []string{p}}.names) {
				t.Errorf("tier %q names %q, which is no package of the module", tr.name, p)
			}
		}
	}
}

// placePackages finds each package's tier; a package in none or in several
// is an error.
func placePackages(t *testing.T, tiers []tier, graph map[string][]string) map[string]tier {
	tierOf := map[string]tier{}
	for pkg := range graph {
		var in []string
		for _, tr := range tiers {
			if tr.names(pkg) {
				in = append(in, tr.name)
				tierOf[pkg] = tr
			}
		}
		if len(in) != 1 {
			t.Errorf("package %s is in %d tiers %v of design.md's layout table, want exactly one", pkg, len(in), in)
		}
	}
	return tierOf
}
