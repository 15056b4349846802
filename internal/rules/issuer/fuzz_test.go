package issuer

import (
	"strings"
	"testing"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// FuzzNoRequestStopsTheQueue: whatever bytes a tenant puts in a
// request's fields (multibyte, invalid UTF-8, oversized, empty), the
// decision never fails for the resource, and the honest request queued
// behind it is issued once the hostile one has held and released, or at
// once when the hostile one is denied. FIFO order holds: the honest request
// is never issued before a hostile one that can be served.
func FuzzNoRequestStopsTheQueue(f *testing.F) {
	f.Add("req", "lease", "", "owner")
	f.Add(strings.Repeat("ü", 128), "lease", "", "owner")
	f.Add("req", strings.Repeat("ü", 127)+"x", strings.Repeat("é", 200), "owner")
	f.Add("req", "lease", "cat", strings.Repeat("\xff", 300))
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, requestID, lease, category, owner string) {
		signer := testSigner(t)
		res := fr(10)
		hostile, honest := lg("hostile", 0), lg("honest", time.Second)
		hostile.Spec.RequestID, hostile.Spec.Lease, hostile.Spec.OperationCategory, hostile.Spec.Owner = requestID, lease, category, owner
		grants := []locksv1.LockGrant{hostile, honest}
		in := Input{Resource: res, Grants: grants, Now: t0.Add(2 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: signer}
		apply(t, in) // fails the test on a decision error
		switch got := phases(grants); got {
		case "hostile=Denied honest=Held":
			return
		case "hostile=Held honest=Pending":
		default:
			t.Fatalf("after the first decision: %s", got)
		}
		// The hostile request could be served: it holds, releases, and the
		// honest one is issued next.
		grants[0].Spec.Release = true
		apply(t, Input{Resource: res, Grants: grants, Now: t0.Add(3 * time.Second), Epoch: 1, TakeoverAt: t0, Signer: signer})
		if got := phases(grants); got != "hostile=Released honest=Held" {
			t.Fatalf("after the hostile request's release: %s", got)
		}
	})
}
