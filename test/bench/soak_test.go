package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// TestQuickSoak runs the hostile-tenant soak (`make soak`) with a short
// hostile phase (two 12 s windows beside 6 s quiet ones, 80 big-annotation
// grants: make soak's rate) and fails when its verdict is FAIL. An INCONCLUSIVE check (too few
// samples for a tail, or the target-claim collector's pass not due within
// the short wait) does not fail it; the run must still have measured every
// side.
func TestQuickSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane; skipped with -short")
	}
	rep, raw := runMain(t, "soak.json", "-only", "soak", "-soak-duration", "24s", "-soak-windows", "2", "-soak-big-grants", "80",
		"-soak-settle", "6s", "-soak-collect-wait", "5s", "-soak-report-timing")
	s := rep.Soak
	if s == nil {
		t.Fatalf("no soak section: %s", raw)
	}
	for what, n := range map[string]int{
		"quiet honest handoffs":   s.Handoffs.Quiet.N,
		"hostile honest handoffs": s.Handoffs.Hostile.N,
		"big-annotation grants":   s.Inputs.BigGrants.Attempts,
		"entry churn creates":     s.Inputs.Churn.Created.Attempts,
		"odd-input cases":         len(s.Inputs.Odd),
		"wrong-pod attempts":      len(s.Inputs.WrongPod),
		"operator RSS samples":    s.Memory.Anon.AfterCleanupSamples,
		"quiet floor handoffs":    s.Floor.Quiet.N,
		"hostile floor handoffs":  s.Floor.Hostile.N,
	} {
		if n == 0 {
			t.Errorf("%s: none measured", what)
		}
	}
	if s.FloorError != "" {
		t.Errorf("the floor handoff stopped early: %s", s.FloorError)
	}
	if len(s.Checks) != 12 {
		t.Errorf("%d checks judged, want 12", len(s.Checks))
	}
	if s.Verdict == verdictFail {
		for _, c := range s.Checks {
			if c.Result == verdictFail {
				t.Errorf("soak check %q failed: %s (rule: %s) %s", c.Name, c.Measured, c.Rule, c.Detail)
			}
		}
	}
}

func msN(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

func TestCheckTail(t *testing.T) {
	quiet := repeat(msN(10), 200)
	for name, c := range map[string]struct {
		hostile [][]time.Duration
		want    string
	}{
		"within the limit":                {[][]time.Duration{repeat(msN(19), 150), repeat(msN(20), 150)}, verdictPass},
		"over it in every window":         {[][]time.Duration{repeat(msN(30), 150), repeat(msN(30), 150)}, verdictFail},
		"over it in one window of two":    {[][]time.Duration{append(repeat(msN(10), 140), repeat(msN(90), 10)...), repeat(msN(10), 150)}, verdictInconclusive},
		"few samples, each of them slow":  {[][]time.Duration{repeat(msN(900), 4), repeat(msN(800), 3)}, verdictFail},
		"few samples, only the tail slow": {[][]time.Duration{{msN(10), msN(11), msN(900)}, {msN(10), msN(12)}}, verdictInconclusive},
		"no hostile sample at all":        {[][]time.Duration{nil, nil}, verdictInconclusive},
		"one window of two is not enough": {[][]time.Duration{repeat(msN(30), 150), repeat(msN(10), 150)}, verdictInconclusive},
		"two windows of three are":        {[][]time.Duration{repeat(msN(30), 150), repeat(msN(10), 150), repeat(msN(30), 150)}, verdictFail},
	} {
		if got := checkTail("x", quiet, c.hostile); got.Result != c.want {
			t.Errorf("%s: %s (%s; %s), want %s", name, got.Result, got.Measured, got.Detail, c.want)
		}
	}
}

func TestHandoffSamplesPairReleaseWithNextFence(t *testing.T) {
	t0 := time.Now()
	fenceAt := map[int64]time.Time{1: t0, 2: t0.Add(50 * time.Millisecond), 3: t0.Add(80 * time.Millisecond)}
	releases := []releaseEvent{
		{fence: 1, at: t0.Add(40 * time.Millisecond)},
		{fence: 2, at: t0.Add(70 * time.Millisecond), tenant: true},
		{fence: 3, at: t0.Add(90 * time.Millisecond)}, // no fence 4 seen: the run ended
	}
	got := handoffSamples(releases, fenceAt, false)
	if len(got) != 1 || got[0].d != 10*time.Millisecond {
		t.Fatalf("honest handoffs %+v, want one of 10ms", got)
	}
	if got := handoffSamples(releases, fenceAt, true); len(got) != 1 || got[0].d != 10*time.Millisecond {
		t.Fatalf("tenant handoffs %+v, want one of 10ms", got)
	}
}

func TestWithoutTenantHolds(t *testing.T) {
	t0 := time.Now()
	at := func(n int) time.Time { return t0.Add(msN(n)) }
	spans := []holderSpan{{tenant: true, start: at(0), end: at(100)}, {start: at(100), end: at(200)}, {tenant: true, start: at(250), end: at(400)}}
	// 50..350: 50 of the first tenant hold, 100 of the last.
	if got := withoutTenantHolds(waitSample{at(50), at(350)}, spans); got != msN(150) {
		t.Fatalf("got %s, want 150ms", got)
	}
}

func TestPoolsSortSamplesByWindow(t *testing.T) {
	t0 := time.Now()
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	r := &soakResult{Windows: []soakWindow{
		{Kind: windowQuiet, Start: at(0), End: at(10)}, {Kind: windowHostile, Start: at(10), End: at(20)},
		{Kind: windowPause, Start: at(20), End: at(30)}, {Kind: windowHostile, Start: at(30), End: at(40)},
		{Kind: windowAfterCleanup, Start: at(40), End: at(50)},
	}}
	samples := []timedSample{
		{at: at(1), end: at(2), d: 1},   // quiet
		{at: at(9), end: at(11), d: 2},  // straddles into hostile 1
		{at: at(15), end: at(16), d: 3}, // hostile 1
		{at: at(25), end: at(26), d: 4}, // pause: neither
		{at: at(29), end: at(31), d: 5}, // into hostile 2
		{at: at(41), end: at(42), d: 6}, // after cleanup
		{at: at(49), end: at(51), d: 7}, // ends outside its window
	}
	q, h := r.pools(samples, true)
	if !slices.Equal(q, []time.Duration{1, 6}) || len(h) != 2 || !slices.Equal(h[0], []time.Duration{2, 3}) || !slices.Equal(h[1], []time.Duration{5}) {
		t.Fatalf("by overlap: quiet %v, hostile %v", q, h)
	}
	q, h = r.pools(samples, false)
	if !slices.Equal(q, []time.Duration{1, 2, 6, 7}) || !slices.Equal(h[0], []time.Duration{3}) || h[1] != nil {
		t.Fatalf("by start: quiet %v, hostile %v", q, h)
	}
}

func TestCollectorDue(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := start.Add(3 * time.Minute)
	for _, c := range []struct {
		lastClaim time.Time
		want      time.Time
	}{
		{time.Time{}, now},
		{start.Add(time.Minute), start.Add(10 * time.Minute)},
		{start.Add(7*time.Minute + 59*time.Second), start.Add(10 * time.Minute)},
		{start.Add(8*time.Minute + time.Second), start.Add(20 * time.Minute)},
	} {
		if got := collectorDue(start, c.lastClaim, now); !got.Equal(c.want) {
			t.Errorf("last claim at %s: due %s, want %s", c.lastClaim.Format(time.TimeOnly), got.Format(time.TimeOnly), c.want.Format(time.TimeOnly))
		}
	}
}

func TestOddNames(t *testing.T) {
	for _, c := range []struct {
		length, dotAt  int
		grantNameValid bool
	}{{253, 0, true}, {253, 199, true}} {
		name := dnsName(c.length, 42, c.dotAt)
		if len(name) != c.length || len(validation.IsDNS1123Subdomain(name)) != 0 {
			t.Fatalf("dnsName(%d, %d) = %q is not a %d-character DNS subdomain: %v", c.length, c.dotAt, name, c.length, validation.IsDNS1123Subdomain(name))
		}
		grantName := locksv1.LockGrantName(name, "tenant", "odd-1")
		if valid := len(validation.IsDNS1123Subdomain(grantName)) == 0; valid != c.grantNameValid {
			t.Errorf("LockGrantName of %q = %q: valid %v, want %v", name, grantName, valid, c.grantNameValid)
		}
	}
	if got := len(padding(262121)); got != 262121 {
		t.Errorf("padding(262121) is %d bytes", got)
	}
	if got := squeeze("x \"üüüüüüüüüü\" aa"); got != `x "ü×10" aa` {
		t.Errorf("squeeze: %q", got)
	}
	if got := decodeLit("\"a\xff\\ud800\""); got != "a\uFFFD\uFFFD" {
		t.Errorf("decodeLit: %q", got)
	}
}

func TestOutcomeOf(t *testing.T) {
	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("WRONG_OWNER: from another pod"))
	withCause := &apierrors.StatusError{ErrStatus: metav1.Status{Reason: metav1.StatusReasonForbidden, Message: "denied",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: fence.CauseVerdict, Message: "DELETE_NOT_DECLARED"}}}}}
	for err, want := range map[error]string{
		nil: "ACCEPTED", denied: "WRONG_OWNER", withCause: "DELETE_NOT_DECLARED",
		apierrors.NewConflict(schema.GroupResource{Resource: "lockgrants"}, "x", errors.New("changed")): "Conflict",
	} {
		if got := outcomeOf(err); got != want {
			t.Errorf("outcomeOf(%v) = %q, want %q", err, got, want)
		}
	}
}

func TestAttackList(t *testing.T) {
	var c soakConfig
	if err := (attackList{&c}).Set("squat, replica"); err != nil {
		t.Fatal(err)
	}
	if !c.runs(attackSquat) || c.runs(attackBig) || (attackList{&c}).String() != "replica,squat" {
		t.Fatalf("attacks %v", c.attacks)
	}
	if err := (attackList{&c}).Set("squat,flood"); err == nil {
		t.Fatal("an unknown attack was accepted")
	}
	if err := (attackList{&c}).Set("all"); err != nil || !c.runs(attackBig) {
		t.Fatalf("all: %v %v", err, c.attacks)
	}
}

func TestReportTimingJudgesTheOthers(t *testing.T) {
	r := soakResult{Checks: []soakCheck{{Name: "honest handoff p99", Result: verdictFail}, {Name: "changes from the wrong pod", Result: verdictPass}}}
	r.reportTiming()
	if r.Verdict != verdictPass || r.Checks[0].Result != verdictReported {
		t.Fatalf("timing FAIL reported: verdict %s, check %s", r.Verdict, r.Checks[0].Result)
	}
	r.Checks[1].Result = verdictFail
	if r.reportTiming(); r.Verdict != verdictFail {
		t.Fatalf("a failing safety check must still fail the run: %s", r.Verdict)
	}
}

// TestSoakWhere reads a window's figures from two scrapes of each side's
// metrics, and leaves 0 (never NaN, which JSON cannot hold) where nothing
// was observed.
func TestSoakWhere(t *testing.T) {
	op := func(count, sum float64, le10ms, le100ms float64) string {
		return fmt.Sprintf(`workqueue_queue_duration_seconds_bucket{controller="grant-issuer",name="grant-issuer",le="0.01"} %g
workqueue_queue_duration_seconds_bucket{controller="grant-issuer",name="grant-issuer",le="0.1"} %g
workqueue_queue_duration_seconds_bucket{controller="grant-issuer",name="grant-issuer",le="+Inf"} %g
workqueue_queue_duration_seconds_sum{controller="grant-issuer",name="grant-issuer"} %g
workqueue_queue_duration_seconds_count{controller="grant-issuer",name="grant-issuer"} %g
workqueue_queue_duration_seconds_sum{controller="other",name="other"} 1000
workqueue_queue_duration_seconds_count{controller="other",name="other"} 1
`, le10ms, le100ms, count, sum, count)
	}
	before := soakScrape{operator: op(10, 0.05, 10, 10)}
	after := soakScrape{operator: op(110, 1.05, 60, 110)}
	w := where(before, after)
	if w.IssuerQueueMeanMs != 10 {
		t.Errorf("queue wait mean %v ms, want 10 (1 s over 100 items, the other controller left out)", w.IssuerQueueMeanMs)
	}
	if w.IssuerQueueP99Ms <= 10 || w.IssuerQueueP99Ms > 100 {
		t.Errorf("queue wait p99 %v ms, want in the 10–100 ms bucket", w.IssuerQueueP99Ms)
	}
	if w.IssuerWorkMeanMs != 0 || w.LockGrantPatchP99Ms != 0 {
		t.Errorf("figures with no observation: %+v, want 0", w)
	}
	if _, err := json.Marshal(w); err != nil {
		t.Errorf("the window's figures do not encode: %v", err)
	}
}

// TestJudgeAgainstTheSoakFloor: a slowdown the floor handoff alone shows is
// out of reach, and the line against the floor judges what the operator adds.
func TestJudgeAgainstTheSoakFloor(t *testing.T) {
	windows := func(d time.Duration) [][]time.Duration {
		return [][]time.Duration{repeat(d, 200), repeat(d, 200), repeat(d, 200)}
	}
	quiet := repeat(msN(10), 300)
	slowFloor := slowdownOf(quiet, windows(msN(30))) // 3×, in every window
	calmFloor := slowdownOf(quiet, windows(msN(12))) // 1.2×
	for name, c := range map[string]struct {
		honest     [][]time.Duration
		floor      floorSlowdown
		tail, vsFl string
	}{
		"the floor alone misses the limit, the operator adds little": {windows(msN(35)), slowFloor, verdictOutOfReach, verdictPass},
		"the floor alone misses the limit, the operator adds more":   {windows(msN(45)), slowFloor, verdictOutOfReach, verdictFail},
		"the floor holds, the operator does not":                     {windows(msN(25)), calmFloor, verdictFail, verdictFail},
		"both hold":                                                  {windows(msN(14)), calmFloor, verdictPass, verdictPass},
		"too few floor samples":                                      {windows(msN(25)), slowdownOf(repeat(msN(10), 20), windows(msN(30))), verdictFail, verdictInconclusive},
		"faster than the baseline":                                   {windows(msN(9)), slowFloor, verdictPass, verdictPass},
	} {
		t.Run(name, func(t *testing.T) {
			tail := c.floor.againstFloor(checkTail("x", quiet, c.honest))
			if tail.Result != c.tail {
				t.Errorf("slowdown line %s, want %s: %s %s", tail.Result, c.tail, tail.Measured, tail.Detail)
			}
			vs := checkAgainstFloor("y", quiet, c.honest, c.floor)
			if vs.Result != c.vsFl {
				t.Errorf("line against the floor %s, want %s: %s %s", vs.Result, c.vsFl, vs.Measured, vs.Detail)
			}
		})
	}
	if got := overall([]soakCheck{{Result: verdictOutOfReach}, {Result: verdictPass}}); got != verdictPass {
		t.Errorf("an OUT OF REACH line with a passing line against the floor: overall %s, want PASS", got)
	}
}
