package lockclient

import (
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The grant's end is reported by two sources (the LockGrant and the
// registry's end record); both must map it the same way.
func TestPhaseForLock(t *testing.T) {
	for _, tc := range []struct {
		phase     locksv1.LockGrantPhase
		asked     bool
		wantPhase locksv1.LockGrantPhase
		wantWhy   string
	}{
		{locksv1.PhaseReleased, true, locksv1.PhaseReleased, ""},
		{locksv1.PhaseReleased, false, locksv1.PhaseExpired, "deleted"},
		{locksv1.PhaseExpired, true, locksv1.PhaseExpired, "why"},
		{locksv1.PhaseExpired, false, locksv1.PhaseExpired, "why"},
		{locksv1.PhaseHeld, false, locksv1.PhaseHeld, "why"},
		{locksv1.PhaseRevoked, true, locksv1.PhaseRevoked, "why"},
	} {
		phase, why := phaseForLock(tc.phase, tc.asked, "why", "deleted")
		if phase != tc.wantPhase || why != tc.wantWhy {
			t.Errorf("phaseForLock(%s, asked=%v) = %s, %q; want %s, %q", tc.phase, tc.asked, phase, why, tc.wantPhase, tc.wantWhy)
		}
	}
}
