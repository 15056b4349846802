package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestLockGrantName(t *testing.T) {
	long := strings.Repeat("r", 253)
	for _, c := range []struct{ resource, owner, req string }{{"batch", "a", "r1"}, {"batch", "a", "r2"}, {long, "a", "r1"}} {
		n := LockGrantName(c.resource, c.owner, c.req)
		if len(n) > 253 || !strings.HasPrefix(n, c.resource[:min(len(c.resource), 200)]+"-") || n != LockGrantName(c.resource, c.owner, c.req) {
			t.Errorf("LockGrantName(%.20q, %q, %q) = %q: want a stable name of at most 253 characters starting with the resource", c.resource, c.owner, c.req, n)
		}
		if !LockGrantNameForm(n) {
			t.Errorf("LockGrantName(%.20q, %q, %q) = %q is not of LockGrantNameForm", c.resource, c.owner, c.req, n)
		}
	}
	// The formula is a contract (tooling outside this module may compute it):
	// printf 'batch\0worker-a\0nightly-2026-07-19' | sha256sum, first 16 digits.
	if got, want := LockGrantName("batch", "worker-a", "nightly-2026-07-19"), "batch-33168aa605f14579"; got != want {
		t.Errorf("LockGrantName = %s, want %s", got, want)
	}
	for _, pair := range [][2][3]string{
		{{"batch", "a", "r1"}, {"batch", "a", "r2"}},
		{{"batch", "a", "r"}, {"batch", "b", "r"}}, // the owner is part of the name
		{{"a", "o", "b-c"}, {"a-b", "o", "c"}},
	} {
		x, y := pair[0], pair[1]
		if LockGrantName(x[0], x[1], x[2]) == LockGrantName(y[0], y[1], y[2]) {
			t.Errorf("%q and %q share a name", x, y)
		}
	}
}

// TestLockGrantNameOfALongDottedResource: a cut that ends on a dot would
// give "….-<digits>", which the API server refuses: the dot is dropped.
func TestLockGrantNameOfALongDottedResource(t *testing.T) {
	resource := strings.Repeat("r", 199) + "." + strings.Repeat("s", 53)
	n := LockGrantName(resource, "o", "r1")
	if want := strings.Repeat("r", 199) + "-"; !strings.HasPrefix(n, want) || len(validation.IsDNS1123Subdomain(n)) != 0 {
		t.Errorf("LockGrantName of a resource with a dot at 200 = %q: want a valid name starting %.10q…", n, want)
	}
}

func TestLockGrantNameForm(t *testing.T) {
	for name, want := range map[string]bool{
		"batch-0123456789abcdef":   true,
		"a-b-0123456789abcdef":     true,
		"nightly-import":           false,
		"batch-0123456789ABCDEF":   false, // uppercase: not the library's
		"batch-0123456789abcde":    false, // 15 digits
		"batch-0123456789abcdef0":  false, // 17 digits
		"batch-x0123456789abcdef":  false,
		"batch0123456789abcdef":    false, // no dash before the digits
		"batch-0123456789abcdef.x": false,
		"nightly-2026071912345678": true, // looks like a date, is the form: refused unless it is the request's name
		"":                         false,
		"0123456789abcdef":         false,
	} {
		if got := LockGrantNameForm(name); got != want {
			t.Errorf("LockGrantNameForm(%q) = %v, want %v", name, got, want)
		}
	}
}
