package main

import (
	"strings"
	"testing"
)

func TestGoMemLimit(t *testing.T) {
	cases := []struct {
		name    string
		limit   int64
		ratio   float64
		envSet  bool
		want    int64
		wantErr bool
	}{
		{"90% of 1Gi", 1 << 30, 0.9, false, 966367641, false},
		{"whole limit", 512 << 20, 1, false, 512 << 20, false},
		{"no limit known", 0, 0.9, false, 0, false},
		{"explicit GOMEMLIMIT wins", 1 << 30, 0.9, true, 0, false},
		{"ratio above one", 1 << 30, 1.5, false, 0, true},
		{"zero ratio", 1 << 30, 0, false, 0, true},
		{"negative limit", -1, 0.9, false, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := goMemLimit(c.limit, c.ratio, c.envSet)
			if (err != nil) != c.wantErr || got != c.want {
				t.Fatalf("goMemLimit(%d, %v, %v) = %d, %v; want %d, error %v", c.limit, c.ratio, c.envSet, got, err, c.want, c.wantErr)
			}
		})
	}
}

func TestUninstallRefusesBadArguments(t *testing.T) {
	for _, args := range [][]string{{"extra"}, {"--no-such-flag"}} {
		var out strings.Builder
		if code := uninstall(args, &out); code != 2 || out.Len() == 0 {
			t.Errorf("manager uninstall %v = exit %d, output %q; want exit 2 and a message", args, code, out.String())
		}
	}
}
