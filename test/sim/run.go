package sim

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

func init() {
	// The webhook and planner log through controller-runtime; the simulator
	// reports through its trace.
	ctrl.SetLogger(logr.Discard())
}

// Config shapes the schedules of a run. The zero value is the release-gate
// configuration: the real acceptance point, every fault.
type Config struct {
	// Faults are the faults schedules draw from; nil means all of them.
	Faults []Fault
	// Suppress lists faults that are drawn as usual but not applied; the
	// minimizer uses it to find which faults a failure needs.
	Suppress []Fault
	// Acceptance wraps the acceptance point (the real webhook). Tests use it
	// to break a rule on purpose and show that the oracle notices.
	Acceptance func(AcceptFunc) AcceptFunc
	// EntryAdmission wraps the FencedResource webhook's decision on the
	// schedule's entry, as Acceptance does the acceptance point's.
	EntryAdmission func(EntryAdmitFunc) EntryAdmitFunc
	// UncoveredKindOneIn: one schedule in this many registers a kind the
	// webhook configuration does not route (0: the default, 50; -1: none).
	UncoveredKindOneIn int
	// TwinEntryOneIn: in one schedule in this many a co-tenant creates a
	// second entry for the same object, while the first is being stored or
	// after (0: the default, 20; -1: none).
	TwinEntryOneIn int
	// unnamedClaims: the API server stores every target claim, as if two
	// objects could share a name: the webhook's rule before target claims
	// (a lookup, which overlapping creates both pass). Tests only.
	unnamedClaims bool
	// lostSendsProvenAbsent: the client rule before make chaos found it wrong, which took a
	// read that does not show a write for proof that it is absent even
	// while the write may still land. Tests only.
	lostSendsProvenAbsent bool
	// StoreOneIn: one schedule in this many has a PostgreSQL store beside
	// the object (0: the default, storeOneIn; -1: none).
	StoreOneIn int
	// storeFaults: the store faults schedules draw from (nil: all). Tests only.
	storeFaults []storeFault
	// storeBroken breaks a store or publisher rule on purpose. Tests only.
	storeBroken storeBroken
	// Trace records one line per event (slow: for replaying a seed).
	Trace bool
	// StopAtFirstViolation ends a schedule at its first violation.
	StopAtFirstViolation bool
}

// Counters are what one or more schedules counted.
type Counters struct {
	Schedules int64
	// Violated counts violations by kind (see violationNames).
	Violated [numViolationKinds]int64

	Attempts         int64 // mutations the acceptance point decided
	AuthFailures     int64 // of those, the ones the oracle judged unauthenticated
	ForgedAttempts   int64 // of those, forged, tampered, malformed or cross-resource
	Mutations        int64 // mutations written to the protected object
	CheckedMutations int64 // of those, written with an ACCEPTED verdict
	Commits          int64 // authenticated segments written
	GrantsIssued     int64
	JobsDone         int64
	JobsAbandoned    int64

	DeleteAttempts   int64 // deletes the acceptance point decided
	Deletes          int64 // of those, the ones that removed the target
	TeardownDeletes  int64 // of those, the namespace controller's during teardown
	KnownLimitWrites int64 // unfenced writes in the documented index-lag window
	// DeletedMemoryLostWrites: re-creations whose segments started over
	// because a registry restore took back the record of the deletion.
	DeletedMemoryLostWrites int64
	IndexLagLookups         int64 // target-index lookups answered while the index lagged
	// StaleGrantsRead: LockGrants the issuer's lagging cache showed older
	// than the API server did when it read them before queueing or issuing.
	StaleGrantsRead int64
	// UncoveredEntries: schedules whose entry named a kind the webhook
	// configuration does not route; EntriesRefused: entries the
	// FencedResource webhook refused.
	UncoveredEntries int64
	EntriesRefused   int64
	// TwinEntries: second entries a co-tenant created for the schedule's
	// object (TwinsInFlight of them while the first was admitted but not
	// stored); TwinsRefused: those the FencedResource webhook refused.
	TwinEntries   int64
	TwinsInFlight int64
	TwinsRefused  int64

	UnknownOutcomes     int64 // writes that got no answer (MUTATION_UNKNOWN)
	UnknownApplied      int64
	UnknownAbsent       int64
	UnknownUndetermined int64 // flagged ReconciliationRequired
	UnknownUnsettled    int64 // still unknown when the schedule ended
	// UnknownInFlight: resolutions that found the write not landed but still
	// able to land (the object at the version it was conditioned on).
	UnknownInFlight int64
	// LateCommits: writes admitted whose etcd transaction came later, after
	// their client gave up: landed, or failed as the object had moved on.
	LateCommitsLanded    int64
	LateCommitsFailed    int64
	MaxUnknownResolution time.Duration

	LinearizabilityUnknown int64

	Faults        [numFaults]int64
	Verdicts      map[fence.Verdict]int64
	FaultVerdicts [numFaults]map[fence.Verdict]int64

	// The store path (store.go).
	StoreSchedules       int64
	StoreAttempts        int64 // begin_segment decisions
	StoreForgedAttempts  int64 // of those, with a grant the registry never issued for this resource
	StoreCommits         int64 // segments that landed
	StoreSegments        int64 // of those, judged by the store oracle
	StoreRefusedAtCommit int64 // accepted by begin_segment, refused by the check at COMMIT
	StoreVerdicts        map[fence.Verdict]int64
	StoreFaultVerdicts   [numStoreFaults]map[fence.Verdict]int64
	StoreFaults          [numStoreFaults]int64
	StorePublications    int64 // publication transactions the store applied
	StorePublishFailures int64 // publications refused or without an answer in time (retried with backoff)
	StoreWaitsGivenUp    int64 // workers that gave a lock up waiting for its publication
	// StoreDeposed: publications a deposed leader sent late (at every
	// leader change); StoreDeposedRefused of them refused EPOCH_SUPERSEDED,
	// StoreDeposedLanded applied (they arrived before the successor's first).
	StoreDeposed        int64
	StoreDeposedRefused int64
	StoreDeposedLanded  int64
	// StoreLagWrites: segments committed in the documented publication lag, by lagNames.
	StoreLagWrites           [numLagReasons]int64
	StoreUnknown             int64 // COMMITs without an answer
	StoreUnknownApplied      int64
	StoreUnknownAbsent       int64
	StoreUnknownUndetermined int64
	StoreUnknownUnsettled    int64
	StoreMaxResolution       time.Duration

	Steps       int64
	VirtualTime time.Duration
}

func (c *Counters) init() {
	c.Verdicts = map[fence.Verdict]int64{}
	c.StoreVerdicts = map[fence.Verdict]int64{}
	for i := range c.StoreFaultVerdicts {
		c.StoreFaultVerdicts[i] = map[fence.Verdict]int64{}
	}
	for i := range c.FaultVerdicts {
		c.FaultVerdicts[i] = map[fence.Verdict]int64{}
	}
}

func (c *Counters) countVerdict(v fence.Verdict, f Fault) {
	c.Verdicts[v]++
	if f >= 0 && f < numFaults {
		c.FaultVerdicts[f][v]++
	}
}

// countStoreVerdict counts a store decision, for the store fault f that
// produced it (negative: none).
func (c *Counters) countStoreVerdict(v fence.Verdict, f storeFault) {
	c.StoreVerdicts[v]++
	if f >= 0 && f < numStoreFaults {
		c.StoreFaultVerdicts[f][v]++
	}
}

// countRefusal counts, for a fault's write, an answer the apiserver gave
// before admission (a failed resourceVersion precondition, say).
func (c *Counters) countRefusal(s replyStatus, f Fault) {
	if f >= 0 && f < numFaults {
		c.FaultVerdicts[f][fence.Verdict("("+s.String()+")")]++
	}
}

func (c *Counters) add(o *Counters) {
	c.Schedules += o.Schedules
	for i := range c.Violated {
		c.Violated[i] += o.Violated[i]
	}
	c.Attempts += o.Attempts
	c.AuthFailures += o.AuthFailures
	c.ForgedAttempts += o.ForgedAttempts
	c.Mutations += o.Mutations
	c.CheckedMutations += o.CheckedMutations
	c.Commits += o.Commits
	c.GrantsIssued += o.GrantsIssued
	c.JobsDone += o.JobsDone
	c.JobsAbandoned += o.JobsAbandoned
	c.DeleteAttempts += o.DeleteAttempts
	c.Deletes += o.Deletes
	c.TeardownDeletes += o.TeardownDeletes
	c.KnownLimitWrites += o.KnownLimitWrites
	c.DeletedMemoryLostWrites += o.DeletedMemoryLostWrites
	c.IndexLagLookups += o.IndexLagLookups
	c.StaleGrantsRead += o.StaleGrantsRead
	c.UncoveredEntries += o.UncoveredEntries
	c.EntriesRefused += o.EntriesRefused
	c.TwinEntries += o.TwinEntries
	c.TwinsInFlight += o.TwinsInFlight
	c.TwinsRefused += o.TwinsRefused
	c.UnknownOutcomes += o.UnknownOutcomes
	c.UnknownApplied += o.UnknownApplied
	c.UnknownAbsent += o.UnknownAbsent
	c.UnknownUndetermined += o.UnknownUndetermined
	c.UnknownUnsettled += o.UnknownUnsettled
	c.UnknownInFlight += o.UnknownInFlight
	c.LateCommitsLanded += o.LateCommitsLanded
	c.LateCommitsFailed += o.LateCommitsFailed
	c.MaxUnknownResolution = max(c.MaxUnknownResolution, o.MaxUnknownResolution)
	c.LinearizabilityUnknown += o.LinearizabilityUnknown
	for i := range c.Faults {
		c.Faults[i] += o.Faults[i]
		for v, n := range o.FaultVerdicts[i] {
			c.FaultVerdicts[i][v] += n
		}
	}
	for v, n := range o.Verdicts {
		c.Verdicts[v] += n
	}
	c.StoreSchedules += o.StoreSchedules
	c.StoreAttempts += o.StoreAttempts
	c.StoreForgedAttempts += o.StoreForgedAttempts
	c.StoreCommits += o.StoreCommits
	c.StoreSegments += o.StoreSegments
	c.StoreRefusedAtCommit += o.StoreRefusedAtCommit
	for v, n := range o.StoreVerdicts {
		c.StoreVerdicts[v] += n
	}
	for i := range c.StoreFaults {
		c.StoreFaults[i] += o.StoreFaults[i]
		for v, n := range o.StoreFaultVerdicts[i] {
			c.StoreFaultVerdicts[i][v] += n
		}
	}
	c.StorePublications += o.StorePublications
	c.StorePublishFailures += o.StorePublishFailures
	c.StoreWaitsGivenUp += o.StoreWaitsGivenUp
	c.StoreDeposed += o.StoreDeposed
	c.StoreDeposedRefused += o.StoreDeposedRefused
	c.StoreDeposedLanded += o.StoreDeposedLanded
	for i := range c.StoreLagWrites {
		c.StoreLagWrites[i] += o.StoreLagWrites[i]
	}
	c.StoreUnknown += o.StoreUnknown
	c.StoreUnknownApplied += o.StoreUnknownApplied
	c.StoreUnknownAbsent += o.StoreUnknownAbsent
	c.StoreUnknownUndetermined += o.StoreUnknownUndetermined
	c.StoreUnknownUnsettled += o.StoreUnknownUnsettled
	c.StoreMaxResolution = max(c.StoreMaxResolution, o.StoreMaxResolution)
	c.Steps += o.Steps
	c.VirtualTime += o.VirtualTime
}

// TotalViolations is the number of violations of every kind.
func (c *Counters) TotalViolations() int64 {
	var n int64
	for _, v := range c.Violated {
		n += v
	}
	return n
}

// Result is one schedule's outcome.
type Result struct {
	Seed uint64
	Counters
	Violations []Violation // the first few
	Trace      []string    // with Config.Trace
}

// Failed reports whether the schedule broke any rule.
func (r *Result) Failed() bool { return r.TotalViolations() > 0 }

// RunSchedule plays the schedule with the given seed. A panic anywhere in the
// system under test is a failure of the schedule, not of the run.
func RunSchedule(seed uint64, cfg Config) (res *Result) {
	w := newWorld(seed, cfg)
	defer func() {
		if p := recover(); p != nil {
			w.oracle.violation(vSimulator, "panic: %v\n%s", p, debug.Stack())
			res = w.res
			res.Schedules = 1
		}
	}()
	return w.run()
}

// Report sums a run of many schedules.
type Report struct {
	Counters
	BaseSeed uint64
	Parallel int
	Elapsed  time.Duration
	// Failed are the first failing schedules (without traces); FailedCount all of them.
	Failed      []*Result
	FailedCount int
}

// Run plays n schedules, seeds base … base+n-1, on parallel goroutines
// (GOMAXPROCS when parallel < 1). done, when not nil, counts finished schedules.
func Run(base uint64, n, parallel int, cfg Config, done *atomic.Int64) *Report {
	if parallel < 1 {
		parallel = runtime.GOMAXPROCS(0)
	}
	start := time.Now()
	rep := &Report{BaseSeed: base, Parallel: parallel}
	rep.init()
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			var sum Counters
			sum.init()
			var failed []*Result
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					break
				}
				res := RunSchedule(base+uint64(i), cfg)
				sum.add(&res.Counters)
				if res.Failed() {
					res.Trace = nil
					failed = append(failed, res)
				}
				if done != nil {
					done.Add(1)
				}
			}
			mu.Lock()
			rep.add(&sum)
			rep.FailedCount += len(failed)
			rep.Failed = append(rep.Failed, failed...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(rep.Failed, func(a, b *Result) int { return cmpSeed(a.Seed, b.Seed) })
	if len(rep.Failed) > 20 {
		rep.Failed = rep.Failed[:20]
	}
	rep.Elapsed = time.Since(start)
	return rep
}

func cmpSeed(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Minimize replays a failing schedule up to its first violation and drops,
// one at a time, every fault the failure does not need. It returns the
// smallest failing replay (with its trace) and the faults it suppressed.
func Minimize(seed uint64, cfg Config) (*Result, []Fault) {
	cfg.StopAtFirstViolation, cfg.Trace = true, false
	first := RunSchedule(seed, cfg)
	if !first.Failed() {
		return first, nil
	}
	suppressed := slices.Clone(cfg.Suppress)
	for f := range numFaults {
		if first.Faults[f] == 0 || slices.Contains(suppressed, f) {
			continue
		}
		try := cfg
		try.Suppress = append(slices.Clone(suppressed), f)
		if RunSchedule(seed, try).Failed() {
			suppressed = try.Suppress
		}
	}
	cfg.Suppress, cfg.Trace = suppressed, true
	return RunSchedule(seed, cfg), suppressed
}

// Describe lists a result's violations.
func (r *Result) Describe() string {
	s := fmt.Sprintf("seed %d: %d violation(s)", r.Seed, r.TotalViolations())
	for _, v := range r.Violations {
		s += fmt.Sprintf("\n  step %d: %s: %s", v.Step, v.Kind, v.Detail)
	}
	return s
}
