package controllers

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func grantWithRecord(name string, rec any) locksv1.LockGrant {
	lg := locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if rec != nil {
		raw, ok := rec.(string)
		if !ok {
			b, _ := json.Marshal(rec)
			raw = string(b)
		}
		lg.Annotations = map[string]string{locksv1.AnnotationUnresolvedMutation: raw}
	}
	return lg
}

func TestSummarizeUnresolved(t *testing.T) {
	now := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	rec := func(age time.Duration) locksv1.UnresolvedMutation {
		return locksv1.UnresolvedMutation{Object: "ConfigMap/batch", Operation: "settle", Fence: 3, Segment: 2, Since: now.Add(-age)}
	}
	grants := []locksv1.LockGrant{
		grantWithRecord("clean", nil),
		grantWithRecord("young", rec(5*time.Minute)),
		grantWithRecord("younger", rec(14*time.Minute)),
		grantWithRecord("overdue", rec(15*time.Minute)),
		grantWithRecord("skewed", rec(-time.Hour)), // a worker clock an hour ahead
		grantWithRecord("garbled", "{not json"),
	}
	s := summarizeUnresolved(grants, now)
	if len(s.overdue) != 2 {
		t.Fatalf("overdue = %q, want the 15-minute-old and the unreadable record", s.overdue)
	}
	if !strings.Contains(s.overdue[0], "LockGrant garbled: unreadable record") ||
		!strings.Contains(s.overdue[1], "LockGrant overdue: ConfigMap/batch operation settle segment 2 under fence 3") {
		t.Errorf("overdue = %q", s.overdue)
	}
	if s.nextDue != time.Minute {
		t.Errorf("nextDue = %s, want 1m (the 14-minute-old record)", s.nextDue)
	}
	if !strings.Contains(s.message(), "2 write outcome(s) unknown for more than 15m0s") {
		t.Errorf("message = %q", s.message())
	}
	if got := summarizeUnresolved(grants[:1], now); len(got.overdue) != 0 || got.nextDue != 0 {
		t.Errorf("no records: %+v", got)
	}
	// The skewed record counts from now: due in 15 minutes, not in 75.
	if got := summarizeUnresolved(grants[4:5], now); got.nextDue != 15*time.Minute {
		t.Errorf("skewed record: nextDue = %s, want 15m", got.nextDue)
	}
}

// TestUnresolvedMessageIsBounded: records are the
// LockGrant owners' text; one record over 32 KiB once made the condition
// update fail for good. The message stays well under the API's limit
// whatever the records hold, and still counts them all.
func TestUnresolvedMessageIsBounded(t *testing.T) {
	now := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	var grants []locksv1.LockGrant
	for i := range 50 {
		rec, _ := json.Marshal(locksv1.UnresolvedMutation{Object: "ConfigMap/" + strings.Repeat("ü", 20000), Operation: "op", Fence: 1, Segment: int64(i), Since: now.Add(-time.Hour)})
		grants = append(grants, locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("g%02d", i),
			Annotations: map[string]string{locksv1.AnnotationUnresolvedMutation: string(rec)}}})
	}
	msg := summarizeUnresolved(grants, now).message()
	if len(msg) > 8<<10 || !utf8.ValidString(msg) {
		t.Fatalf("message is %d bytes (valid UTF-8: %v)", len(msg), utf8.ValidString(msg))
	}
	if !strings.HasPrefix(msg, "50 write outcome(s)") || !strings.Contains(msg, "and 40 more") {
		t.Errorf("message does not count every record: %.200s", msg)
	}
}
