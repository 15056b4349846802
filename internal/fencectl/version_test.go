package fencectl

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/internal/version"
)

func TestVersionCommand(t *testing.T) {
	old, oldCommit := version.Version, version.Commit
	t.Cleanup(func() { version.Version, version.Commit = old, oldCommit })
	version.Version, version.Commit = "v1.2.3", "abc123"

	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("kubectl fence version exited %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "Client Version: v1.2.3 (commit abc123, ") {
		t.Fatalf("text output %q", out.String())
	}

	out.Reset()
	if code := Run(context.Background(), []string{"version", "-o", "json", "--client"}, &out, &errOut); code != 0 {
		t.Fatalf("kubectl fence version -o json exited %d: %s", code, errOut.String())
	}
	var got map[string]version.Info
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("json output %q: %v", out.String(), err)
	}
	if got["clientVersion"].Version != "v1.2.3" || got["clientVersion"].Commit != "abc123" {
		t.Fatalf("json output %+v", got)
	}
}
