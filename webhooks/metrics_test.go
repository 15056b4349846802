package webhooks

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRecordDecisionCountsDenialsByNamespace(t *testing.T) {
	recordDecision("team-a", "STALE_FENCE", "Enforce", true, false)
	recordDecision("team-a", "STALE_FENCE", "Shadow", true, true)
	recordDecision("team-b", "ACCEPT", "Enforce", false, true)
	if got := testutil.ToFloat64(denials.WithLabelValues("team-a", "STALE_FENCE", "Enforce")); got != 1 {
		t.Errorf("Enforce denials in team-a = %v, want 1", got)
	}
	if got := testutil.ToFloat64(denials.WithLabelValues("team-a", "STALE_FENCE", "Shadow")); got != 1 {
		t.Errorf("Shadow denials in team-a = %v, want 1 (reported, let through)", got)
	}
	if n := testutil.CollectAndCount(denials); n != 2 {
		t.Errorf("%d denial series, want 2: an accepted write is no denial", n)
	}
	if got := testutil.ToFloat64(decisions.WithLabelValues("STALE_FENCE", "Shadow", "true")); got != 1 {
		t.Errorf("Shadow decision answered allowed = %v, want 1", got)
	}
}
