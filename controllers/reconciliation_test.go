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

var testPayload = "sha256:" + strings.Repeat("0", 64)

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
		return locksv1.UnresolvedMutation{Object: "ConfigMap/batch", Operation: "settle", Fence: 3, Segment: 2, Payload: testPayload, Since: now.Add(-age)}
	}
	grants := []locksv1.LockGrant{
		grantWithRecord("clean", nil),
		grantWithRecord("young", rec(5*time.Minute)),
		grantWithRecord("younger", rec(14*time.Minute)),
		grantWithRecord("overdue", rec(15*time.Minute)),
		grantWithRecord("skewed", rec(-time.Hour)), // a worker clock an hour ahead
		grantWithRecord("garbled", "{not json"),
		grantWithRecord("partial", `{"object":"ConfigMap/x"}`),
	}
	s := summarizeUnresolved(grants, now)
	if len(s.overdue) != 1 || !strings.Contains(s.overdue[0], "LockGrant overdue: ConfigMap/batch operation settle segment 2 under fence 3") {
		t.Fatalf("overdue = %q, want the 15-minute-old record only", s.overdue)
	}
	if len(s.unreadable) != 2 || !strings.HasPrefix(s.unreadable[0], "LockGrant garbled: not an unresolved-mutation record: invalid character") ||
		!strings.HasPrefix(s.unreadable[1], "LockGrant partial: not an unresolved-mutation record: operation must be") {
		t.Errorf("unreadable = %q, want the garbled and the partial value", s.unreadable)
	}
	if s.nextDue != time.Minute {
		t.Errorf("nextDue = %s, want 1m (the 14-minute-old record)", s.nextDue)
	}
	if !strings.Contains(s.message(), "1 write outcome(s) unknown for more than 15m0s") || !strings.Contains(s.message(), "2 unreadable value(s)") {
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
// whatever the records and unreadable values hold, and still counts them all.
func TestUnresolvedMessageIsBounded(t *testing.T) {
	now := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	var grants []locksv1.LockGrant
	for i := range 50 {
		// The longest record there is: each listed entry is cut.
		rec := locksv1.UnresolvedMutation{Object: "ConfigMap/" + strings.Repeat("ü", 125), Operation: strings.Repeat("o", 253), Fence: 1,
			Segment: int64(i + 1), Payload: testPayload, Since: now.Add(-time.Hour)}
		grants = append(grants, grantWithRecord(fmt.Sprintf("g%02d", i), rec),
			grantWithRecord(fmt.Sprintf("u%02d", i), `{"`+strings.Repeat("ü", 2000)+`":1}`))
	}
	s := summarizeUnresolved(grants, now)
	for _, msg := range []string{s.message(), s.unreadableMessage()} {
		if len(msg) > 8<<10 || !utf8.ValidString(msg) {
			t.Fatalf("message is %d bytes (valid UTF-8: %v)", len(msg), utf8.ValidString(msg))
		}
		if !strings.HasPrefix(msg, "50 ") || !strings.Contains(msg, "and 40 more") {
			t.Errorf("message does not count every record: %.200s", msg)
		}
	}
}

func TestReconciliationCondition(t *testing.T) {
	overdue := unresolvedSummary{overdue: []string{"LockGrant g: …"}, unreadable: []string{"LockGrant u: …"}}
	unreadable := unresolvedSummary{unreadable: []string{"LockGrant u: not an unresolved-mutation record: …"}}
	for name, c := range map[string]struct {
		s              unresolvedSummary
		exists         bool
		status, reason string // "" status: no condition
	}{
		"nothing, never said":     {unresolvedSummary{}, false, "", ""},
		"nothing, said before":    {unresolvedSummary{}, true, "False", locksv1.ReasonNoUnresolvedMutation},
		"overdue and unreadable":  {overdue, false, "True", locksv1.ReasonUnresolvedMutation},
		"unreadable only":         {unreadable, false, "False", locksv1.ReasonUnreadableMutationRecord},
		"unreadable, said before": {unreadable, true, "False", locksv1.ReasonUnreadableMutationRecord},
	} {
		got := c.s.condition(c.exists, 4)
		switch {
		case c.status == "" && got != nil:
			t.Errorf("%s: condition %+v, want none", name, got)
		case c.status != "" && (got == nil || string(got.Status) != c.status || got.Reason != c.reason || got.ObservedGeneration != 4):
			t.Errorf("%s: condition %+v, want %s/%s", name, got, c.status, c.reason)
		}
	}
	if got := unreadable.condition(false, 1).Message; !strings.Contains(got, "LockGrant u: not an unresolved-mutation record") {
		t.Errorf("unreadable message %q does not say which LockGrant and why", got)
	}
}
