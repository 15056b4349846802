package webhooks

import (
	"testing"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestDecideClaim(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	grace := 2 * time.Minute
	for _, c := range []struct {
		name          string
		holderTargets bool
		age           time.Duration
		want          claimVerdict
	}{
		{"the holder protects the target, however old the claim", true, time.Hour, claimDuplicate},
		{"the holder protects the target, fresh claim", true, 0, claimDuplicate},
		{"holder not stored, claim fresh: its create may still land", false, time.Second, claimInFlight},
		{"holder not stored, claim just under the grace", false, grace - time.Millisecond, claimInFlight},
		{"holder gone, claim at the grace", false, grace, claimTakeOver},
		{"holder gone long ago", false, 24 * time.Hour, claimTakeOver},
	} {
		if got := decideClaim(c.holderTargets, now.Add(-c.age), now, grace); got != c.want {
			t.Errorf("%s: got %d, want %d", c.name, got, c.want)
		}
	}
}

func TestTargetClaimName(t *testing.T) {
	a := locksv1.TargetClaimName("ns", locksv1.TargetKey("", "ConfigMap", "batch"))
	if a != locksv1.TargetClaimName("ns", locksv1.TargetKey("", "ConfigMap", "batch")) {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{
		locksv1.TargetClaimName("ns2", locksv1.TargetKey("", "ConfigMap", "batch")),
		locksv1.TargetClaimName("ns", locksv1.TargetKey("", "ConfigMap", "batch2")),
		locksv1.TargetClaimName("ns", locksv1.TargetKey("example.com", "ConfigMap", "batch")),
	} {
		if other == a {
			t.Fatalf("%s names two targets", a)
		}
	}
	if len(a) > 63 {
		t.Fatalf("%s is longer than a label value may be", a)
	}
}
