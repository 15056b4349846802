package chaos

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The checker's rules on hand-made histories: each must find what it is for.

func ann(req string, f, seg int64) map[string]string {
	e := map[string]any{"grant": map[string]any{"resource": "ns/cm-0", "requestID": req, "fenceToken": f}, "segment": seg, "proof": "x", "operation": "op", "payload": "p"}
	b, _ := json.Marshal(e)
	return map[string]string{fence.AnnotationFence: string(b)}
}

func newResult() *scheduleResult {
	return &scheduleResult{violations: map[string][]string{}, counts: map[string]int{}}
}

func TestCheckObjectsOrderAndIssue(t *testing.T) {
	issued := map[string]map[int64]string{"cm-0": {1: "a", 2: "b"}}
	obs := newObserver(nil, "ns")
	cases := []struct {
		name string
		vs   []version
		want string
	}{
		{"in order", []version{{rev: 1, annotations: ann("a", 1, 1)}, {rev: 2, annotations: ann("a", 1, 2)}, {rev: 3, annotations: ann("b", 2, 1)}}, ""},
		{"lower fence after higher", []version{{rev: 1, annotations: ann("b", 2, 1)}, {rev: 2, annotations: ann("a", 1, 2)}}, vOrder},
		{"segment skipped", []version{{rev: 1, annotations: ann("a", 1, 1)}, {rev: 2, annotations: ann("a", 1, 3)}}, vOrder},
		{"unfenced write", []version{{rev: 1, annotations: ann("a", 1, 1)}, {rev: 2}}, vOrder},
		{"grant never issued", []version{{rev: 1, annotations: ann("forged", 1, 1)}}, vUnissued},
	}
	for _, tc := range cases {
		r := newResult()
		r.checkObjects(map[string][]version{"cm-0": tc.vs}, issued, nil, obs)
		got := ""
		for _, k := range violationKinds {
			if len(r.violations[k]) > 0 {
				got = k
			}
		}
		if got != tc.want {
			t.Errorf("%s: found %q, want %q (%v)", tc.name, got, tc.want, r.violations)
		}
	}
}

// A write sent after a higher fence was seen issued is stale, whatever the
// object holds; one sent before is not.
func TestCheckObjectsStaleByObservation(t *testing.T) {
	issued := map[string]map[int64]string{"cm-0": {1: "a", 2: "b"}}
	obs := newObserver(nil, "ns")
	seen := time.Unix(100, 0)
	obs.first["cm-0"] = map[int64]time.Time{1: time.Unix(90, 0), 2: seen}
	for _, tc := range []struct {
		sent  time.Time
		stale bool
	}{{seen.Add(-time.Millisecond), false}, {seen.Add(time.Millisecond), true}} {
		calls := map[string]Event{"x": {ID: "x", Kind: "call", Resource: "cm-0", RequestID: "a", Fence: 1, Segment: 1, At: tc.sent.UnixNano()}}
		r := newResult()
		r.checkObjects(map[string][]version{"cm-0": {{rev: 1, annotations: ann("a", 1, 1)}}}, issued, calls, obs)
		if got := len(r.violations[vStale]) > 0; got != tc.stale {
			t.Errorf("sent %v after the higher fence was seen: stale %t, want %t", tc.sent.Sub(seen), got, tc.stale)
		}
	}
}

func TestCheckRegistry(t *testing.T) {
	fr := func(rev, token, holder int64, req string, epoch int64) version {
		return version{rev: rev, status: map[string]any{"fenceToken": float64(token),
			"holder": map[string]any{"fenceToken": float64(holder), "requestID": req, "issuerEpoch": float64(epoch)}}}
	}
	r := newResult()
	r.checkRegistry(map[string][]version{"/x/cm-0": {fr(1, 1, 1, "a", 1), fr(2, 2, 2, "b", 2), fr(3, 1, 2, "c", 2)}})
	if len(r.violations[vFenceLowered]) != 1 || len(r.violations[vFenceTwice]) != 1 {
		t.Errorf("want one lowered fence and one fence issued twice, got %v", r.violations)
	}
	r = newResult()
	r.checkRegistry(map[string][]version{"/x/cm-0": {fr(1, 1, 1, "a", 2), fr(2, 2, 2, "b", 1)}})
	if r.deposedIssues != 1 || len(r.violations) != 0 {
		t.Errorf("a grant under epoch 1 after epoch 2: deposed %d, violations %v", r.deposedIssues, r.violations)
	}
}

func TestCheckOutcomes(t *testing.T) {
	landed := map[string]map[string]bool{"cm-0": {"a/1": true}}
	events := []Event{
		{ID: "1", Kind: "return", Resource: "cm-0", RequestID: "a", Segment: 1, Outcome: "ok"},
		{ID: "2", Kind: "return", Resource: "cm-0", RequestID: "a", Segment: 2, Outcome: "ok"}, // lost
		{ID: "3", Kind: "return", Resource: "cm-0", RequestID: "b", Segment: 1, Outcome: "unknown"},
		{ID: "3/resolve", Kind: "resolve", Outcome: "unresolved", Detail: "3"}, // not escalated
		{Kind: "stale", Resource: "cm-0", Outcome: "ok"},
		{ID: "4", Kind: "return", Resource: "cm-0", RequestID: "a", Segment: 1, Outcome: "rejected"}, // yet a/1 landed
	}
	r := newResult()
	r.checkOutcomes(events, landed, nil)
	for _, k := range []string{vLost, vUnknown, vAdversary, vAbsentLanded} {
		if len(r.violations[k]) != 1 {
			t.Errorf("%s: %v", k, r.violations[k])
		}
	}
	r = newResult()
	r.checkOutcomes(events[2:4], landed, map[string][]version{"/x/lg": {{annotations: map[string]string{"fencekeeper.dev/unresolved-mutation": "{}"}, spec: map[string]any{"requestID": "b"}}}})
	if len(r.violations) != 0 {
		t.Errorf("an unknown outcome recorded on its LockGrant is escalated: %v", r.violations)
	}
}

// A read that misses an acknowledged write is not linearizable; the same
// history with the write's outcome unknown is.
func TestCheckLinearizable(t *testing.T) {
	hist := func(outcome string) []Event {
		return []Event{
			{ID: "w", Kind: "call", Resource: "cm-0", RequestID: "a", Fence: 1, Segment: 1, At: 1},
			{ID: "w", Kind: "return", Resource: "cm-0", RequestID: "a", Fence: 1, Segment: 1, Outcome: outcome, At: 2},
			{ID: "r", Kind: "call", Resource: "cm-0", Detail: "read", At: 3},
			{ID: "r", Kind: "read", Resource: "cm-0", Outcome: "absent", At: 4},
		}
	}
	r := newResult()
	r.checkLinearizable(hist("ok"))
	if len(r.violations[vLinear]) != 1 {
		t.Errorf("an acknowledged write the next read misses was accepted: %v", r.violations)
	}
	r = newResult()
	r.checkLinearizable(hist("unknown"))
	if len(r.violations) != 0 {
		t.Errorf("an unknown write may not have landed: %v", r.violations)
	}
}

func TestPlanReplaysAndCoversEveryKind(t *testing.T) {
	a, b := plan(42, 3*time.Minute, faultKinds), plan(42, 3*time.Minute, faultKinds)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed drew two schedules")
	}
	kinds := map[string]bool{}
	for _, f := range a {
		kinds[f.Kind] = true
		if f.Start+f.Length > 3*time.Minute {
			t.Errorf("%s ends past the schedule", f)
		}
	}
	if len(kinds) != len(faultKinds) {
		t.Errorf("a 3-minute schedule has %d of %d kinds: %v", len(kinds), len(faultKinds), kinds)
	}
	if reflect.DeepEqual(a, plan(43, 3*time.Minute, faultKinds)) {
		t.Error("two seeds drew the same schedule")
	}
}

func TestCheckWatches(t *testing.T) {
	objects := map[string][]version{"cm-0": {{rev: 5, annotations: ann("a", 1, 1)}, {rev: 7, annotations: ann("a", 1, 2)}}}
	for _, tc := range []struct {
		name string
		seen []watched
		bad  bool
	}{
		{"etcd's order, a relist repeating the current version", []watched{{"cm-0", 5, registerValue{Fence: 1, Req: "a", Segment: 1}}, {"cm-0", 7, registerValue{Fence: 1, Req: "a", Segment: 2}}, {"cm-0", 7, registerValue{Fence: 1, Req: "a", Segment: 2}}}, false},
		{"a version etcd never stored", []watched{{"cm-0", 6, registerValue{Fence: 1, Req: "a", Segment: 2}}}, true},
		{"another value at a stored revision", []watched{{"cm-0", 7, registerValue{Fence: 2, Req: "b", Segment: 1}}}, true},
		{"backwards", []watched{{"cm-0", 7, registerValue{Fence: 1, Req: "a", Segment: 2}}, {"cm-0", 5, registerValue{Fence: 1, Req: "a", Segment: 1}}}, true},
	} {
		obs := newObserver(nil, "ns")
		obs.seen[1] = tc.seen
		r := newResult()
		r.checkWatches(objects, obs)
		if got := len(r.violations[vWatch]) > 0; got != tc.bad {
			t.Errorf("%s: violation %t, want %t: %v", tc.name, got, tc.bad, r.violations)
		}
	}
}

// A violation comes with its cut-down trace: the revisions around it and
// the client events within a second of the write.
func TestTraceOfAViolation(t *testing.T) {
	issued := map[string]map[int64]string{"cm-0": {1: "a", 2: "b"}}
	obs := newObserver(nil, "ns")
	vs := []version{{rev: 10, annotations: ann("a", 1, 1)}, {rev: 20, annotations: ann("b", 2, 1)}, {rev: 30, annotations: ann("a", 1, 2)}, {rev: 40, annotations: ann("b", 2, 2)}}
	r := newResult()
	r.events = []Event{{Worker: "worker-1", Kind: "call", Resource: "cm-0", At: 5}}
	r.checkObjects(map[string][]version{"cm-0": vs}, issued, nil, obs)
	if len(r.traces) == 0 {
		t.Fatal("no trace for a write out of order")
	}
	for _, want := range []string{"etcd @10", "etcd @20", "etcd @30", "etcd @40"} {
		if !strings.Contains(r.traces[0], want) {
			t.Errorf("the trace lacks %q:\n%s", want, r.traces[0])
		}
	}
}

// The store's rules on hand-made rows, receipts and worker logs.
func TestCheckStore(t *testing.T) {
	issued := map[string]map[int64]string{"cm-0": {1: "a", 2: "b", 3: "c"}}
	row := func(seq, f, seg int64, req, payload string) storeRow {
		return storeRow{seq: seq, fence: f, segment: seg, req: req, op: "op-" + req, payload: payload, xact: fmt.Sprint(seq), at: time.Unix(seq, 0)}
	}
	rcpt := func(x storeRow) storeReceipt {
		return storeReceipt{fence: x.fence, segment: x.segment, op: x.op, payload: x.payload, xact: x.xact, committedAt: x.at.Add(-time.Millisecond)}
	}
	legal := []storeRow{row(1, 1, 1, "a", "p1"), row(2, 1, 2, "a", "p2"), row(4, 2, 1, "b", "p3"), row(7, 3, 1, "c", "p4"), row(8, 3, 2, "c", "p5")}
	kept := []storeReceipt{rcpt(legal[3]), rcpt(legal[4])}
	acked := []Event{
		{Kind: "store", Resource: "cm-0", RequestID: "a", Segment: 2, Payload: "p2", Outcome: "ok"},
		{Kind: "store", Resource: "cm-0", RequestID: "b", Segment: 2, Payload: "p9", Outcome: "denied"},
		{Kind: "store-stale", Resource: "cm-0", RequestID: "a", Segment: 3, Payload: "p8", Outcome: "denied"},
	}
	cases := []struct {
		name     string
		rows     []storeRow
		receipts []storeReceipt
		highest  int64
		events   []Event
		want     string
	}{
		{"legal", legal, kept, 3, acked, ""},
		{"a lower fence committed after a higher one", []storeRow{legal[0], legal[2], row(5, 1, 3, "a", "p6")}, []storeReceipt{rcpt(legal[2])}, 2, nil, vStoreStale},
		{"a segment skipped", []storeRow{legal[0], row(3, 1, 3, "a", "p6")}, []storeReceipt{rcpt(legal[0]), rcpt(row(3, 1, 3, "a", "p6"))}, 1, nil, vStoreOrder},
		{"a new fence not at segment 1", []storeRow{legal[0], row(3, 2, 2, "b", "p6")}, []storeReceipt{rcpt(row(3, 2, 2, "b", "p6"))}, 2, nil, vStoreOrder},
		{"a grant never issued", []storeRow{row(1, 1, 1, "forged", "p1")}, []storeReceipt{rcpt(row(1, 1, 1, "forged", "p1"))}, 1, nil, vStoreUnissued},
		{"an acknowledged commit missing", legal[:2], []storeReceipt{rcpt(legal[0]), rcpt(legal[1])}, 1,
			[]Event{{Kind: "store", Resource: "cm-0", RequestID: "b", Segment: 1, Payload: "p3", Outcome: "ok"}}, vStoreLost},
		{"a refused commit landed", legal, kept, 3, []Event{{Kind: "store", Resource: "cm-0", RequestID: "c", Segment: 2, Payload: "p5", Outcome: "rejected"}}, vStoreRefusedLanded},
		{"an unknown commit not escalated", legal, kept, 3, []Event{{Kind: "store", Resource: "cm-0", RequestID: "c", Segment: 3, Payload: "p7", Outcome: "unknown"}}, vStoreUnknown},
		{"an adversary write in", legal, kept, 3, []Event{{Kind: "store-raw", Resource: "cm-0", RequestID: "a", Segment: 3, Payload: "p8", Outcome: "ok"}}, vStoreAdversary},
		{"a receipt of another transaction's change", legal, []storeReceipt{rcpt(legal[3]), {fence: 3, segment: 2, op: "op-c", payload: "other", xact: "8"}}, 3, nil, vStoreReceipts},
		{"a row of the highest fence without its receipt", legal, kept[:1], 3, nil, vStoreReceipts},
		{"the store's fence is not its rows'", legal, kept, 4, nil, vStoreReceipts},
	}
	for _, tc := range cases {
		r := newResult()
		st := &storeState{rows: map[string][]storeRow{"cm-0": tc.rows}, receipts: map[string][]storeReceipt{"cm-0": tc.receipts}, highest: map[string]int64{"cm-0": tc.highest}}
		r.checkStore(st, issued, tc.events, map[string]bool{})
		var got []string
		for _, k := range violationKinds {
			if len(r.violations[k]) > 0 {
				got = append(got, k)
			}
		}
		if want := []string{tc.want}; tc.want == "" && len(got) > 0 || tc.want != "" && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: found %q, want %q (%v)", tc.name, got, tc.want, r.violations)
		}
	}
	r := newResult()
	st := &storeState{rows: map[string][]storeRow{"cm-0": legal}, receipts: map[string][]storeReceipt{"cm-0": kept}, highest: map[string]int64{"cm-0": 3}}
	r.checkStore(st, issued, []Event{{Kind: "store", Resource: "cm-0", RequestID: "c", Segment: 3, Payload: "p7", Outcome: "unknown"}}, map[string]bool{"c": true})
	if len(r.violations) != 0 {
		t.Errorf("an unknown commit recorded on its LockGrant is escalated: %v", r.violations)
	}
}
