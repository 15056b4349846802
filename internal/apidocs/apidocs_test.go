package apidocs

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/api-reference.md (make api-docs)")

const reference = "../../docs/api-reference.md"

// TestReferenceIsCurrent fails when docs/api-reference.md does not match the
// CRDs: the reference is generated, and a stale one misleads.
func TestReferenceIsCurrent(t *testing.T) {
	var crds [][]byte
	for _, f := range []string{"locks.fencekeeper.dev_fencedresources.yaml", "locks.fencekeeper.dev_lockgrants.yaml"} {
		raw, err := os.ReadFile(filepath.Join("../../config/crd/bases", f))
		if err != nil {
			t.Fatal(err)
		}
		crds = append(crds, raw)
	}
	got, err := Render(crds...)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(reference, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(reference)
	if err != nil {
		t.Fatalf("%v (run make api-docs)", err)
	}
	if string(want) != got {
		t.Fatalf("docs/api-reference.md is stale: run make api-docs and commit it")
	}
	for _, s := range []string{"## FencedResource (locks.fencekeeper.dev/v1alpha1)", "`spec.resourceID`", "`status.holder.fenceToken`", "## LockGrant"} {
		if !strings.Contains(got, s) {
			t.Errorf("the reference lacks %q", s)
		}
	}
}

func TestRenderRejectsWhatIsNotACRD(t *testing.T) {
	if _, err := Render([]byte("kind: ConfigMap\nunknownField: 1\n")); err == nil {
		t.Fatal("a document that is not a CRD rendered")
	}
	if _, err := Render([]byte("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")); err == nil || !strings.Contains(err.Error(), "spec.names.kind") {
		t.Fatalf("a CRD without a kind: %v", err)
	}
}
