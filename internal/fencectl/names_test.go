package fencectl

import (
	"strings"
	"testing"
)

func TestNameArg(t *testing.T) {
	cases := []struct {
		t             resourceType
		arg, want     string
		wantErrSubstr string
	}{
		{t: lockGrantType, arg: "batch-1a2b", want: "batch-1a2b"},
		{t: lockGrantType, arg: "lockgrant.locks.fencekeeper.dev/batch-1a2b", want: "batch-1a2b"},
		{t: lockGrantType, arg: "lockgrants/batch", want: "batch"},
		{t: lockGrantType, arg: "LG/batch", want: "batch"},
		{t: lockGrantType, arg: "lockgrant.locks.fencekeeper.dev/", wantErrSubstr: "is not a LockGrant name"},
		{t: lockGrantType, arg: "lockgrant/a/b", wantErrSubstr: "is not a LockGrant name"},
		{t: lockGrantType, arg: "fencedresource.locks.fencekeeper.dev/batch", wantErrSubstr: "names a fencedresource, but this argument is a LockGrant"},
		{t: lockGrantType, arg: "lockgrant.other.example.com/batch", wantErrSubstr: "but this argument is a LockGrant"},
		{t: fencedResourceType, arg: "fr/batch", want: "batch"},
		{t: fencedResourceType, arg: "fencedresource.locks.fencekeeper.dev/batch", want: "batch"},
		{t: fencedResourceType, arg: "configmap/batch", wantErrSubstr: "names a configmap, but this argument is a FencedResource"},
	}
	for _, c := range cases {
		got, err := c.t.nameArg(c.arg)
		switch {
		case c.wantErrSubstr != "":
			if err == nil || !strings.Contains(err.Error(), c.wantErrSubstr) {
				t.Errorf("nameArg(%q) error = %v, want %q", c.arg, err, c.wantErrSubstr)
			}
		case err != nil || got != c.want:
			t.Errorf("nameArg(%q) = %q, %v; want %q", c.arg, got, err, c.want)
		}
	}
	// What -o name prints comes back as the name.
	if got, err := lockGrantType.nameArg(lockGrantType.objectName("x")); err != nil || got != "x" {
		t.Errorf("round trip = %q, %v", got, err)
	}
}
