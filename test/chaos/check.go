package chaos

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Violation kinds the checker counts; every one must be zero.
const (
	vStale        = "accepted stale writes"
	vFenceTwice   = "fences issued twice"
	vFenceLowered = "lowered fences"
	vOrder        = "writes out of fence/segment order"
	vUnissued     = "accepted writes under a grant the registry never issued"
	vLost         = "lost acknowledged segments"
	vUnknown      = "UNKNOWN outcomes neither resolved nor escalated"
	vAbsentLanded = "writes proven absent or reported refused that landed"
	vAdversary    = "adversary writes accepted (stale holder or replay)"
	vLinear       = "objects whose history is not linearizable"
	vWatch        = "watch deliveries etcd does not back, or out of order"

	// The PostgreSQL store, judged from its own rows (store.go).
	vStoreStale         = "store: accepted stale segments"
	vStoreOrder         = "store: segments out of fence/segment order"
	vStoreUnissued      = "store: segments under a grant the registry never issued"
	vStoreLost          = "store: lost acknowledged commits"
	vStoreRefusedLanded = "store: commits reported refused that landed"
	vStoreUnknown       = "store: UNKNOWN commits not escalated"
	vStoreAdversary     = "store: adversary writes accepted"
	vStoreReceipts      = "store: receipts and rows that disagree"
)

var violationKinds = []string{vStale, vFenceTwice, vFenceLowered, vOrder, vUnissued, vLost, vUnknown, vAbsentLanded, vAdversary, vLinear, vWatch,
	vStoreStale, vStoreOrder, vStoreUnissued, vStoreLost, vStoreRefusedLanded, vStoreUnknown, vStoreAdversary, vStoreReceipts}

type scheduleResult struct {
	seed       uint64
	faults     []fault
	violations map[string][]string
	counts     map[string]int
	traces     []string
	// windows: per applied fault, how long no write was accepted, and how
	// many were refused or unknown.
	windows []window
	// Grants issued under an epoch below one already seen: a deposed
	// leader's CAS (harmless when fences stay unique and ordered).
	deposedIssues int
	// events are the workers' logs, for traces.
	events []Event
}

type window struct {
	f       fault
	noWrite time.Duration
	refused int
	// The same for commits to the store.
	noStore      time.Duration
	storeRefused int
}

func (r *scheduleResult) violate(kind, format string, args ...any) {
	r.violations[kind] = append(r.violations[kind], fmt.Sprintf(format, args...))
}

// registerValue is what an accepted write leaves in the object: the grant
// (its requestID), its fence and the segment.
type registerValue struct {
	Absent  bool
	Fence   int64
	Req     string
	Segment int64
}

// follows is the acceptance rule of a fenced register (docs/contract.md): a higher
// fence starting at segment 1, or the same grant's next segment.
func follows(s, w registerValue) bool {
	return (w.Fence > s.Fence && w.Segment == 1) || (w.Fence == s.Fence && w.Req == s.Req && w.Segment == s.Segment+1)
}

// check reads the schedule's whole history back and judges it.
func (c *Cluster) check(ctx context.Context, ns, eventsDir string, obs *observer, faults []fault) (*scheduleResult, error) {
	r := &scheduleResult{violations: map[string][]string{}, counts: map[string]int{}, faults: faults}
	events, err := readEvents(eventsDir)
	if err != nil {
		return nil, err
	}
	cli, err := c.etcdClient()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	frs, err := etcdHistory(ctx, cli, "/registry/locks.fencekeeper.dev/fencedresources/"+ns+"/")
	if err != nil {
		return nil, err
	}
	grants, err := etcdHistory(ctx, cli, "/registry/locks.fencekeeper.dev/lockgrants/"+ns+"/")
	if err != nil {
		return nil, err
	}
	objects := map[string][]version{}
	for _, prefix := range []string{"/registry/configmaps/" + ns + "/", "/registry/example.com/widgets/" + ns + "/"} {
		h, err := etcdHistory(ctx, cli, prefix)
		if err != nil {
			return nil, err
		}
		for k, v := range h {
			objects[k[strings.LastIndex(k, "/")+1:]] = v
		}
	}
	r.events = events
	issued := r.checkRegistry(frs)
	calls := map[string]Event{}
	for _, e := range events {
		switch {
		case e.Kind == "call":
			calls[e.ID] = e
		case e.Kind == "stale" && e.Outcome == "ok":
			// An adversary write that got in: judged like any write, from when it left.
			calls[e.ID+"/stale"] = Event{Resource: e.Resource, RequestID: e.RequestID, Fence: e.Fence, Segment: e.Segment, At: e.Sent}
		}
	}
	st, err := c.readStore(ctx, ns)
	if err != nil {
		return nil, err
	}
	landed := r.checkObjects(objects, issued, calls, obs)
	r.checkWatches(objects, obs)
	r.checkOutcomes(events, landed, grants)
	r.checkStore(st, issued, events, escalations(grants))
	r.checkLinearizable(events)
	r.measureWindows(events)
	return r, nil
}

// checkRegistry: per resource, the fence never decreases and each fence
// names one grant; returns resource -> fence -> requestID issued.
func (r *scheduleResult) checkRegistry(frs map[string][]version) map[string]map[int64]string {
	issued := map[string]map[int64]string{}
	type issue struct{ rev, epoch int64 }
	var issues []issue
	for key, vs := range frs {
		res := key[strings.LastIndex(key, "/")+1:]
		issued[res] = map[int64]string{}
		var last int64
		for _, v := range vs {
			if v.deleted {
				continue
			}
			token := num(v.status["fenceToken"])
			if token < last {
				r.violate(vFenceLowered, "%s: fenceToken %d after %d (etcd revision %d)", res, token, last, v.rev)
			}
			last = token
			h, _ := v.status["holder"].(map[string]any)
			if h == nil {
				continue
			}
			f, req := num(h["fenceToken"]), fmt.Sprint(h["requestID"])
			if prev, ok := issued[res][f]; ok && prev != req {
				r.violate(vFenceTwice, "%s: fence %d issued to %s and to %s", res, f, prev, req)
			}
			if _, ok := issued[res][f]; !ok {
				r.counts["fences issued"]++
				issues = append(issues, issue{v.rev, num(h["issuerEpoch"])})
			}
			issued[res][f] = req
		}
	}
	// In etcd's order across resources: a grant issued under an epoch
	// below one some earlier grant carried came from a deposed leader.
	sort.Slice(issues, func(i, j int) bool { return issues[i].rev < issues[j].rev })
	var maxEpoch int64
	for _, is := range issues {
		if is.epoch < maxEpoch {
			r.deposedIssues++
		}
		maxEpoch = max(maxEpoch, is.epoch)
	}
	return issued
}

func num(v any) int64 {
	switch n := v.(type) {
	case float64:
		return int64(n)
	case int64:
		return n
	}
	return 0
}

// checkObjects walks each protected object's revisions: every accepted
// write follows the register rule, carries a grant the registry issued for
// its resource, and was not sent after a higher fence was seen issued.
// Returns the (requestID, segment) pairs that landed, per object.
func (r *scheduleResult) checkObjects(objects map[string][]version, issued map[string]map[int64]string, calls map[string]Event, obs *observer) map[string]map[string]bool {
	sent := map[string]Event{} // object/req/seg -> its call
	for _, e := range calls {
		if e.RequestID != "" {
			sent[fmt.Sprintf("%s/%s/%d", e.Resource, e.RequestID, e.Segment)] = e
		}
	}
	landed := map[string]map[string]bool{}
	for res, vs := range objects {
		landed[res] = map[string]bool{}
		state := registerValue{Absent: true}
		for _, v := range vs {
			if v.deleted {
				state.Absent = true
				continue
			}
			r.counts["object revisions"]++
			e, ok := parseEnvelope(v.annotations[fence.AnnotationFence])
			if !ok {
				r.violate(vOrder, "%s@%d: stored without a fence annotation", res, v.rev)
				continue
			}
			w := registerValue{Fence: e.Grant.FenceToken, Req: e.Grant.RequestID, Segment: e.Segment}
			if !follows(state, w) {
				r.violate(vOrder, "%s@%d: fence %d segment %d (%s) after fence %d segment %d (%s)", res, v.rev, w.Fence, w.Segment, w.Req, state.Fence, state.Segment, state.Req)
				r.trace(res, v.rev, vs, 0)
			}
			if issued[res][w.Fence] != w.Req || e.Grant.Resource != "" && !strings.HasSuffix(e.Grant.Resource, "/"+res) {
				r.violate(vUnissued, "%s@%d: fence %d of %s; the registry issued it to %q", res, v.rev, w.Fence, w.Req, issued[res][w.Fence])
			}
			if call, ok := sent[fmt.Sprintf("%s/%s/%d", res, w.Req, w.Segment)]; ok {
				if f, at, stale := obs.supersededBefore(res, w.Fence, time.Unix(0, call.At)); stale {
					r.violate(vStale, "%s@%d: fence %d segment %d (%s) sent at %s, %v after fence %d was seen issued",
						res, v.rev, w.Fence, w.Segment, w.Req, time.Unix(0, call.At).Format("15:04:05.000"), time.Unix(0, call.At).Sub(at).Round(time.Millisecond), f)
					r.trace(res, v.rev, vs, call.At)
				}
			}
			landed[res][fmt.Sprintf("%s/%d", w.Req, w.Segment)] = true
			state = w
		}
	}
	return landed
}

// checkWatches: every version an API server's watch delivered is one etcd
// stored (same revision, same fence state), and per object each watch
// delivered them in etcd's order: what the lock client and the informers
// follow is the registry's history, not another.
func (r *scheduleResult) checkWatches(objects map[string][]version, obs *observer) {
	stored := map[string]map[int64]registerValue{}
	for res, vs := range objects {
		stored[res] = map[int64]registerValue{}
		for _, v := range vs {
			if !v.deleted {
				e, _ := parseEnvelope(v.annotations[fence.AnnotationFence])
				stored[res][v.rev] = registerValue{Fence: e.Grant.FenceToken, Req: e.Grant.RequestID, Segment: e.Segment}
			}
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for api, seen := range obs.seen {
		last := map[string]int64{}
		for _, w := range seen {
			r.counts["object versions seen through watches"]++
			if v, ok := stored[w.name][w.rev]; !ok || v != w.value {
				r.violate(vWatch, "api-%d delivered %s@%d (fence %d segment %d); etcd stored %+v there", api+1, w.name, w.rev, w.value.Fence, w.value.Segment, v)
			}
			// A relist may deliver the current version again; never an older one.
			if w.rev < last[w.name] {
				r.violate(vWatch, "api-%d delivered %s@%d after @%d", api+1, w.name, w.rev, last[w.name])
			}
			last[w.name] = w.rev
		}
	}
}

// trace keeps what surrounds a violation, the cut-down trace: the
// object's three revisions before it and two after, and, when the write's send time is known, every
// client event on the resource within a second of it.
func (r *scheduleResult) trace(res string, rev int64, vs []version, sent int64) {
	var b strings.Builder
	fmt.Fprintf(&b, "trace of %s around etcd revision %d:\n", res, rev)
	at := sort.Search(len(vs), func(i int) bool { return vs[i].rev >= rev })
	for _, v := range vs[max(0, at-3):min(len(vs), at+3)] {
		e, _ := parseEnvelope(v.annotations[fence.AnnotationFence])
		fmt.Fprintf(&b, "  etcd @%d  fence %d segment %d grant %s deleted=%t\n", v.rev, e.Grant.FenceToken, e.Segment, e.Grant.RequestID, v.deleted)
	}
	for _, e := range r.events {
		if sent == 0 || e.Resource != res || e.At < sent-int64(time.Second) || e.At > sent+int64(time.Second) {
			continue
		}
		fmt.Fprintf(&b, "  %s  %-8s %-7s %-8s fence %d segment %d %s %s\n", time.Unix(0, e.At).Format("15:04:05.000"), e.Worker, e.Kind, e.Outcome, e.Fence, e.Segment, e.RequestID, e.Detail)
	}
	r.traces = append(r.traces, b.String())
}

// checkOutcomes: every acknowledged segment is in the object's history; an
// unknown outcome was resolved by the worker or escalated on its LockGrant;
// the adversary never got a write in.
func (r *scheduleResult) checkOutcomes(events []Event, landed map[string]map[string]bool, grants map[string][]version) {
	escalated := escalations(grants)
	returns := map[string]Event{}
	for _, e := range events {
		switch e.Kind {
		case "return":
			returns[e.ID] = e
			r.counts["writes "+e.Outcome]++
			in := landed[e.Resource][fmt.Sprintf("%s/%d", e.RequestID, e.Segment)]
			switch {
			case e.Outcome == "ok" && !in:
				r.violate(vLost, "%s: acknowledged segment %d of %s (fence %d) is not in its history", e.Resource, e.Segment, e.RequestID, e.Fence)
			case (e.Outcome == "rejected" || e.Outcome == "denied") && in:
				r.violate(vAbsentLanded, "%s: segment %d of %s was reported %s and is in the history (%s)", e.Resource, e.Segment, e.RequestID, e.Outcome, e.Detail)
			}
		case "stale", "replay":
			r.counts[e.Kind+" writes tried"]++
			switch e.Outcome {
			case "ok":
				r.violate(vAdversary, "%s write with fence %d to %s was accepted", e.Kind, e.Fence, e.Resource)
			case "denied":
				r.counts[e.Kind+" writes denied"]++
			}
		case "acquire":
			r.counts["acquires "+e.Outcome]++
		}
	}
	r.checkResolutions(events, returns, landed, escalated)
}

// escalations: the requestIDs whose LockGrant ever carried an unresolved mutation.
func escalations(grants map[string][]version) map[string]bool {
	escalated := map[string]bool{}
	for _, vs := range grants {
		for _, v := range vs {
			if v.annotations[locksv1.AnnotationUnresolvedMutation] != "" {
				escalated[fmt.Sprint(v.spec["requestID"])] = true
			}
		}
	}
	return escalated
}

// checkResolutions: what a worker resolved agrees with the history, and
// what it could not resolve was escalated on its LockGrant.
func (r *scheduleResult) checkResolutions(events []Event, returns map[string]Event, landed map[string]map[string]bool, escalated map[string]bool) {
	for _, e := range events {
		if e.Kind != "resolve" {
			continue
		}
		w := returns[e.Detail]
		in := landed[w.Resource][fmt.Sprintf("%s/%d", w.RequestID, w.Segment)]
		r.counts["unknown resolved "+e.Outcome]++
		switch {
		case e.Outcome == "applied" && !in:
			r.violate(vLost, "%s: segment %d of %s resolved as applied is not in its history", w.Resource, w.Segment, w.RequestID)
		case e.Outcome == "absent" && in:
			r.violate(vAbsentLanded, "%s: segment %d of %s was proven absent and is in the history", w.Resource, w.Segment, w.RequestID)
		case e.Outcome == "unresolved" && !escalated[w.RequestID]:
			r.violate(vUnknown, "%s: segment %d of %s unresolved and not recorded on its LockGrant", w.Resource, w.Segment, w.RequestID)
		}
	}
}

// checkLinearizable checks each object's client-side history (writes and
// linearizable reads, with the answers the clients got) against a
// sequential fenced register with porcupine.
func (r *scheduleResult) checkLinearizable(events []Event) {
	type op struct {
		in        registerInput
		out       registerOutput
		call, ret int64
	}
	byObj := map[string]map[string]*op{}
	for _, e := range events {
		if byObj[e.Resource] == nil {
			byObj[e.Resource] = map[string]*op{}
		}
		ops := byObj[e.Resource]
		switch e.Kind {
		case "call":
			o := &op{call: e.At, ret: math.MaxInt64, out: registerOutput{Outcome: "unknown"}}
			if e.Detail == "read" {
				o.in.Read = true
			} else {
				o.in.Value = registerValue{Fence: e.Fence, Req: e.RequestID, Segment: e.Segment}
			}
			ops[e.ID] = o
		case "return", "read":
			o := ops[e.ID]
			if o == nil {
				continue
			}
			o.ret, o.out.Outcome = e.At, e.Outcome
			if e.Kind == "read" {
				o.out.Read = registerValue{Absent: e.Outcome == "absent", Fence: e.Fence, Req: e.RequestID, Segment: e.Segment}
			} else if e.Outcome == "ok" {
				o.in.Value.Segment = e.Segment
			}
		}
	}
	for res, ops := range byObj {
		var hist []porcupine.Operation
		for _, o := range ops {
			if o.in.Read && o.out.Outcome == "unknown" {
				continue // a failed read observes nothing
			}
			hist = append(hist, porcupine.Operation{Input: o.in, Output: o.out, Call: o.call, Return: o.ret})
		}
		sort.Slice(hist, func(i, j int) bool { return hist[i].Call < hist[j].Call })
		r.counts["operations checked for linearizability"] += len(hist)
		switch porcupine.CheckOperationsTimeout(registerModel, hist, 60*time.Second) {
		case porcupine.Illegal:
			r.violate(vLinear, "%s: %d operations, no linearization", res, len(hist))
		case porcupine.Unknown:
			r.counts["linearizability checks timed out"]++
		}
	}
}

type registerInput struct {
	Read  bool
	Value registerValue
}

type registerOutput struct {
	Outcome string // ok, denied, rejected, unknown; reads: ok, absent
	Read    registerValue
}

var registerModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{registerValue{Absent: true}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(registerValue), input.(registerInput), output.(registerOutput)
		if in.Read {
			if out.Read == s || (out.Read.Absent && s.Absent) {
				return []any{s}
			}
			return nil
		}
		switch out.Outcome {
		case "ok":
			if follows(s, in.Value) {
				return []any{in.Value}
			}
			return nil
		case "unknown":
			if follows(s, in.Value) {
				return []any{s, in.Value}
			}
			return []any{s}
		}
		return []any{s} // denied or rejected: nothing changed
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(registerInput), output.(registerOutput)
		if in.Read {
			return fmt.Sprintf("read -> fence %d seg %d", out.Read.Fence, out.Read.Segment)
		}
		return fmt.Sprintf("write fence %d seg %d -> %s", in.Value.Fence, in.Value.Segment, out.Outcome)
	},
}).ToModel()

// measureWindows: for each applied fault, the longest time without any
// accepted write from its start to 5 s after it healed, and the writes
// refused or unknown in that span.
func (r *scheduleResult) measureWindows(events []Event) {
	var oks, storeOKs []int64
	for _, e := range events {
		switch {
		case e.Kind == "return" && e.Outcome == "ok":
			oks = append(oks, e.At)
		case e.Kind == "store" && e.Outcome == "ok":
			storeOKs = append(storeOKs, e.At)
		}
	}
	for _, f := range r.faults {
		if f.at.IsZero() {
			continue
		}
		from, to := f.at.UnixNano(), f.healed.Add(5*time.Second).UnixNano()
		w := window{f: f, noWrite: longestGap(oks, from, to), noStore: longestGap(storeOKs, from, to)}
		for _, e := range events {
			if e.Outcome == "ok" || e.At < from || e.At > to {
				continue
			}
			switch e.Kind {
			case "return":
				w.refused++
			case "store":
				w.storeRefused++
			}
		}
		r.windows = append(r.windows, w)
	}
}

// longestGap is the longest span in [from, to] without a time in oks (sorted).
func longestGap(oks []int64, from, to int64) time.Duration {
	var gap time.Duration
	last := from
	for _, t := range oks {
		if t < from {
			continue
		}
		if t > to {
			break
		}
		gap = max(gap, time.Duration(t-last))
		last = t
	}
	return max(gap, time.Duration(to-last))
}

func (r *scheduleResult) print(out io.Writer) {
	fmt.Fprintf(out, "schedule seed=%d:\n", r.seed)
	for _, w := range r.windows {
		fmt.Fprintf(out, "  %s\n      longest time without an accepted write %v, %d writes refused or unknown; store commit %v, %d refused or unknown\n",
			w.f, w.noWrite.Round(100*time.Millisecond), w.refused, w.noStore.Round(100*time.Millisecond), w.storeRefused)
	}
	printCounts(out, r.counts, 44)
	fmt.Fprintf(out, "  %-44s %d\n", "grants issued under a superseded epoch", r.deposedIssues)
	for _, k := range violationKinds {
		fmt.Fprintf(out, "  VIOLATIONS %-40s %d\n", k, len(r.violations[k]))
		for i, v := range r.violations[k] {
			if i == 5 {
				fmt.Fprintf(out, "    ... %d more\n", len(r.violations[k])-5)
				break
			}
			fmt.Fprintf(out, "    %s\n", v)
		}
	}
	for i, t := range r.traces {
		if i == 3 {
			break
		}
		fmt.Fprint(out, t)
	}
}

// printCounts prints counts sorted by name.
func printCounts(out io.Writer, counts map[string]int, width int) {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  %-*s %d\n", width, k, counts[k])
	}
}

// Report sums a run's schedules.
type Report struct {
	Broken     BrokenRules
	Schedules  int
	Seeds      []uint64
	Violations map[string]int
	Counts     map[string]int
	Faults     map[string]int
	// Gaps: per fault kind, the longest time without an accepted write in
	// each injection's window; StoreGaps, without an accepted store commit.
	Gaps, StoreGaps map[string][]time.Duration
}

func (rep *Report) add(s *scheduleResult) {
	if rep.Violations == nil {
		rep.Violations, rep.Counts, rep.Faults, rep.Gaps, rep.StoreGaps = map[string]int{}, map[string]int{}, map[string]int{}, map[string][]time.Duration{}, map[string][]time.Duration{}
	}
	for _, w := range s.windows {
		if w.f.applyErr == "" {
			rep.Gaps[w.f.Kind] = append(rep.Gaps[w.f.Kind], w.noWrite)
			rep.StoreGaps[w.f.Kind] = append(rep.StoreGaps[w.f.Kind], w.noStore)
		}
	}
	rep.Schedules++
	rep.Seeds = append(rep.Seeds, s.seed)
	for k, v := range s.violations {
		rep.Violations[k] += len(v)
	}
	for k, v := range s.counts {
		rep.Counts[k] += v
	}
	rep.Counts["grants issued under a superseded epoch"] += s.deposedIssues
	for _, f := range s.faults {
		if !f.at.IsZero() && f.applyErr == "" {
			rep.Faults[f.Kind]++
		}
	}
}

func sortedGaps(gaps []time.Duration) []time.Duration {
	g := append([]time.Duration(nil), gaps...)
	sort.Slice(g, func(i, j int) bool { return g[i] < g[j] })
	return g
}

// Total is the number of violations found.
func (rep *Report) Total() int {
	n := 0
	for _, v := range rep.Violations {
		n += v
	}
	return n
}

func (rep *Report) print(out io.Writer) {
	fmt.Fprintf(out, "\n== chaos report: %d schedules (seeds %v)\n", rep.Schedules, rep.Seeds)
	if rep.Broken.CachedRegistryRead {
		fmt.Fprintln(out, "   BROKEN RULE: the acceptance webhook read the registry from its informer cache")
	}
	if rep.Broken.UnprotectedStoreTable {
		fmt.Fprintln(out, "   BROKEN RULE: the store's business tables were not put under fencekeeper.protect")
	}
	fmt.Fprintln(out, "faults injected (how many; longest time without an accepted write in each one's window: median, max; the same for store commits):")
	for _, k := range faultKinds {
		g, sg := sortedGaps(rep.Gaps[k]), sortedGaps(rep.StoreGaps[k])
		if len(g) == 0 {
			fmt.Fprintf(out, "  %-52s %d\n", k, rep.Faults[k])
			continue
		}
		fmt.Fprintf(out, "  %-52s %d   %v, %v; store %v, %v\n", k, rep.Faults[k], g[len(g)/2].Round(100*time.Millisecond), g[len(g)-1].Round(100*time.Millisecond),
			sg[len(sg)/2].Round(100*time.Millisecond), sg[len(sg)-1].Round(100*time.Millisecond))
	}
	printCounts(out, rep.Counts, 52)
	fmt.Fprintln(out, "invariants:")
	for _, k := range violationKinds {
		fmt.Fprintf(out, "  %-52s %d\n", k, rep.Violations[k])
	}
	if n := rep.Total(); n > 0 {
		fmt.Fprintf(out, "FAIL: %d violations\n", n)
	} else {
		fmt.Fprintln(out, "PASS: every invariant held")
	}
}
