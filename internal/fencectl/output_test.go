package fencectl

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFormatAndRender(t *testing.T) {
	doc := []map[string]any{{"name": "a", "fenceToken": int64(9007199254740993), "data": map[string]any{"k": "dg=="}}, {"name": "b"}}
	file := filepath.Join(t.TempDir(), "tmpl")
	if err := os.WriteFile(file, []byte(`{range [*]}{.name} {end}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		output, template string
		allowMissing     bool
		want, wantErr    string
	}{
		{output: "json", want: `"fenceToken": 9007199254740993`},
		{output: "yaml", want: "- data:\n    k: dg==\n  fenceToken: 9007199254740993\n  name: a\n- name: b\n"},
		{output: "jsonpath={[*].name}", want: "a b"},
		// int64 fences stay exact in templates (no float64 rounding).
		{output: "jsonpath={[0].fenceToken}", want: "9007199254740993"},
		{output: "jsonpath", template: "{[1].name}", want: "b"},
		{output: "jsonpath-file=" + file, want: "a b "},
		{output: "jsonpath-as-json={[0].name}", want: `"a"`},
		{output: "jsonpath={[1].missing}", allowMissing: true, want: ""},
		{output: "jsonpath={[1].missing}", wantErr: "missing is not found"},
		{output: "go-template={{range .}}{{.name}},{{end}}", want: "a,b,"},
		{output: `go-template={{(index . 0).data.k | base64decode}}`, want: "v"},
		{output: `go-template={{exists (index . 0) "data" "k"}} {{exists (index . 1) "data"}}`, want: "true false"},
		{output: "go-template={{(index . 1).nope}}", wantErr: "map has no entry for key"},
		{output: "template={{len .}}", want: "2"},
		{output: "xml", wantErr: `unknown output format "xml"`},
		{output: "json=x", wantErr: "-o json takes no template"},
		{output: "jsonpath", wantErr: "-o jsonpath needs a template"},
		{output: "jsonpath={.a", wantErr: "bad jsonpath template"},
		{output: "go-template={{.a", wantErr: "bad template"},
		{output: "go-template-file=/nonexistent/t", wantErr: "read the -o go-template-file template"},
	}
	for _, c := range cases {
		t.Run(c.output, func(t *testing.T) {
			f, err := parseFormat(c.output, c.template, c.allowMissing)
			var out bytes.Buffer
			if err == nil {
				o := &options{stdout: &out, format: f}
				err = o.emit(doc, nil, nil)
			}
			switch {
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, c.wantErr)
				}
			case err != nil:
				t.Fatalf("unexpected error: %v", err)
			case !strings.Contains(out.String(), c.want) || c.want == "" && out.Len() > 0:
				t.Fatalf("output %q, want %q", out.String(), c.want)
			}
		})
	}
}

func TestWithPrefix(t *testing.T) {
	got := withPrefix([]string{"b-2\tHeld", "a-1", "b-1\tPending"}, "b")
	if strings.Join(got, ",") != "b-1\tPending,b-2\tHeld" {
		t.Fatalf("withPrefix = %q", got)
	}
}
