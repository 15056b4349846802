package main

import (
	"slices"
	"strings"
	"time"
)

const (
	verdictPass         = "PASS"
	verdictFail         = "FAIL"
	verdictInconclusive = "INCONCLUSIVE"
	// verdictReported: a timing check printed, not judged (-soak-report-timing).
	verdictReported = "REPORTED"
	// verdictOutOfReach: a limit the floor handoff alone missed in the same
	// windows (soak_floor.go); the line against the floor judges instead.
	verdictOutOfReach = "OUT OF REACH"

	windowWarmup       = "warm-up"
	windowQuiet        = "quiet"
	windowHostile      = "hostile"
	windowPause        = "pause"
	windowCleanup      = "cleanup"
	windowAfterCleanup = "after cleanup"
	windowSettle       = "settle"

	// tailLimit: an honest p99 in the hostile windows may be at most this
	// many times the quiet windows' p99.
	tailLimit = 2.0
	// minTailSamples: below it on either side a p99 is a maximum, and an
	// excess is not judged FAIL.
	minTailSamples = 100
	// minWindowSamples: a hostile window with fewer samples does not count
	// as a repetition of an excess.
	minWindowSamples = 20
	// floorLimit: an honest slowdown may be at most this many times the
	// floor handoff's in the same windows, the bench's tail tolerance
	// against the contract's floor.
	floorLimit        = 1.3
	rssGrowthLimitMiB = 64
	rssClimbLimitMiB  = 8
)

// soakResult is what a soak measured and its verdict.
type soakResult struct {
	HostileTime    string       `json:"hostile_time"`
	WindowsAsked   int          `json:"hostile_windows"`
	Attacks        string       `json:"attacks"`
	Tenant         string       `json:"tenant_user"`
	HonestIdentity string       `json:"honest_identity"`
	Windows        []soakWindow `json:"windows"`
	CleanupSeconds float64      `json:"cleanup_seconds"`
	// Handoffs: honest release call → the next holder's fence seen by the
	// soak's watch of the registry, by window kind.
	Handoffs splitDist `json:"honest_handoffs"`
	// Floor: the control's handoffs, the contract's floor with no operator
	// (soak_floor.go), by window kind; FloorError why it stopped early.
	Floor      splitDist `json:"floor_handoffs"`
	FloorError string    `json:"floor_error,omitempty"`
	// TenantHandoffs: the tenant's release of the honest lock → next holder.
	TenantHandoffs dist      `json:"tenant_handoffs_on_honest_lock"`
	Waits          splitDist `json:"honest_waits"`
	// WaitsWithoutTenantHolds: hostile-window waits less the time the
	// tenant held the lock meanwhile.
	WaitsWithoutTenantHolds dist           `json:"honest_waits_hostile_without_tenant_holds"`
	Acquisitions            acquisitions   `json:"honest_acquisitions"`
	WriteFailures           map[string]int `json:"honest_write_failures,omitempty"`
	// HonestReconciliationRequired: the honest entry's ReconciliationRequired
	// condition was seen True.
	HonestReconciliationRequired bool         `json:"honest_entry_reconciliation_required"`
	Inputs                       tenantResult `json:"tenant"`
	ClaimsPeak                   int          `json:"target_claims_peak"`
	Memory                       soakMemory   `json:"operator_memory"`
	Leases                       soakLeases   `json:"operator_namespace_leases"`
	Checks                       []soakCheck  `json:"checks"`
	Verdict                      string       `json:"verdict"`
}

type splitDist struct {
	Quiet   dist `json:"quiet"`
	Hostile dist `json:"hostile"`
}

// soakWindow is one window of the timeline: warm-up, quiet (the baseline
// before the tenant acts), hostile, pause (the tenant sends nothing; what it
// created stays), cleanup, after cleanup (the baseline after), settle (no
// traffic at all).
type soakWindow struct {
	Kind     string    `json:"kind"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Handoffs dist      `json:"honest_handoffs"`
	Floor    dist      `json:"floor_handoffs"`
	Waits    dist      `json:"honest_waits"`
	// Issued: grants of the honest lock first seen in the window (anyone's).
	Issued          int     `json:"issued"`
	IssuedPerSecond float64 `json:"issued_per_second"`
	LastFence       int64   `json:"last_fence"`
	Refused         int     `json:"honest_refused"`
	RSSEndMiB       float64 `json:"operator_rss_end_mib"`
	AnonEndMiB      float64 `json:"operator_anon_end_mib"`
	Claims          int     `json:"target_claims_end"`
	// CPUPercent: each process's CPU time in the window, in % of one core
	// (kube-apiserver, etcd, manager: the operator, bench: this process's
	// clients); MachineBusy the share of the machine's CPU in use (0–1).
	CPUPercent  map[string]float64 `json:"cpu_percent_by_process"`
	MachineBusy float64            `json:"machine_busy"`
	// Where: where time went in the window, by the operator's and the API
	// server's own histograms.
	Where soakWhere `json:"where_time_went"`
}

type acquisitions struct {
	Served  int            `json:"served"`
	Refused int            `json:"refused"`
	Reasons map[string]int `json:"reasons,omitempty"`
}

// tenantResult counts what the tenant sent and what became of it.
type tenantResult struct {
	Annotation       annotationProbe            `json:"annotation_probe"`
	BigGrants        admissionCount             `json:"big_grants_tenant_namespace"`
	BigOnHonest      admissionCount             `json:"big_grants_on_honest_lock"`
	Records          map[string]*admissionCount `json:"unresolved_records"`
	RecordsOnHonest  admissionCount             `json:"overdue_records_on_honest_lock"`
	Churn            churnResult                `json:"entry_churn"`
	Squats           squatResult                `json:"request_id_squats"`
	Odd              []*oddCaseResult           `json:"odd_inputs"`
	WrongPod         map[string]map[string]int  `json:"wrong_pod_attempts"`
	WrongPodMessages map[string]string          `json:"wrong_pod_first_messages"`
	ServedOnHonest   int                        `json:"grants_served_on_honest_lock"`
	ReleaseFailures  int                        `json:"release_failures"`
	LeftAfterCleanup int                        `json:"objects_left_after_cleanup"`
	CleanupErrors    []string                   `json:"cleanup_errors,omitempty"`
	squatUpTo        map[int]int
}

func (t *tenantResult) init() {
	t.Records, t.WrongPod, t.WrongPodMessages, t.squatUpTo = map[string]*admissionCount{}, map[string]map[string]int{}, map[string]string{}, map[int]int{}
}

func (t *tenantResult) record(kind string) *admissionCount {
	if t.Records[kind] == nil {
		t.Records[kind] = &admissionCount{}
	}
	return t.Records[kind]
}

// oddCase returns the result of odd case name, added in catalog order.
func (t *tenantResult) oddCase(name string) *oddCaseResult {
	for _, c := range t.Odd {
		if c.Case == name {
			return c
		}
	}
	c := &oddCaseResult{Case: name}
	t.Odd = append(t.Odd, c)
	return c
}

type admissionCount struct {
	Attempts int    `json:"attempts"`
	Admitted int    `json:"admitted"`
	Refused  int    `json:"refused"`
	Refusal  string `json:"first_refusal,omitempty"`
}

func (c *admissionCount) count(err error) {
	c.Attempts++
	if err == nil {
		c.Admitted++
		return
	}
	c.Refused++
	if c.Refusal == "" {
		c.Refusal = shorten(err.Error(), 240)
	}
}

type churnResult struct {
	Created admissionCount `json:"created"`
	Deleted admissionCount `json:"deleted"`
}

type squatResult struct {
	// Taken: the tenant created a LockGrant with an honest worker's next
	// requestID before the worker did; Late: the worker's came first.
	Taken   int    `json:"taken"`
	Late    int    `json:"late"`
	Refused int    `json:"refused"`
	Refusal string `json:"first_refusal,omitempty"`
}

type annotationProbe struct {
	Probes          []annotationTry `json:"probes"`
	LargestAdmitted int             `json:"largest_admitted_bytes"`
	Refusal         string          `json:"first_refusal,omitempty"`
}

type annotationTry struct {
	Bytes    int  `json:"bytes"`
	Admitted bool `json:"admitted"`
}

type oddCaseResult struct {
	Case     string `json:"case"`
	Attempts int    `json:"attempts"`
	Admitted int    `json:"admitted"`
	Refused  int    `json:"refused"`
	Refusal  string `json:"first_refusal,omitempty"`
	// Of the admitted: Served (held, then released) or Denied; Stalled:
	// neither within 20 s; Unservable: an admitted entry for which no
	// request could be made.
	Served        int    `json:"served"`
	Denied        int    `json:"denied"`
	Stalled       int    `json:"stalled"`
	Unservable    int    `json:"unservable"`
	UnservableWhy string `json:"unservable_why,omitempty"`
}

// soakMemory is the operator's resident memory over the soak: Anon, the
// anonymous memory it allocated (judged), and RSS, which adds the pages of
// its binary it has touched (shown): those grow as code paths run for the
// first time (the tenant's odd inputs reach many), are bounded by the
// binary's size whatever the tenants do, and are reclaimable by the kernel.
type soakMemory struct {
	RSS             rssCourse `json:"rss"`
	Anon            rssCourse `json:"anon"`
	APIServerEndMiB float64   `json:"kube_apiserver_end_mib"`
	EtcdEndMiB      float64   `json:"etcd_end_mib"`
}

// rssCourse is one memory figure: at the first quiet window, its peak from
// then on, and after cleanup.
type rssCourse struct {
	QuietStartMiB float64 `json:"quiet_start_mib"`
	PeakMiB       float64 `json:"peak_mib"`
	PeakWindow    string  `json:"peak_window"`
	GrowthMiB     float64 `json:"growth_mib"`
	// AfterCleanup*: from the settle window on (no traffic), mean of the
	// first and of the last five samples.
	AfterCleanupFirstMiB float64 `json:"after_cleanup_first_mib"`
	AfterCleanupLastMiB  float64 `json:"after_cleanup_last_mib"`
	AfterCleanupSamples  int     `json:"after_cleanup_samples"`
}

type soakLeases struct {
	Own            int       `json:"operator_own"`
	LeftoverClaims int       `json:"leftover_target_claims"`
	Leftover       []string  `json:"leftover_other_leases,omitempty"`
	Examples       []string  `json:"examples,omitempty"`
	CollectorDue   time.Time `json:"collector_pass_due"`
	Waited         string    `json:"waited"`
	WaitedPastDue  bool      `json:"waited_past_due"`
}

type soakCheck struct {
	Name     string `json:"name"`
	Rule     string `json:"rule"`
	Measured string `json:"measured"`
	Result   string `json:"result"`
	Detail   string `json:"detail,omitempty"`
}

// analyze computes the figures and checks from what rec and the tenant recorded.
func (r *soakResult) analyze(rec *soakRecorder, t *tenantSide) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	t.mu.Lock()
	r.Inputs = t.res
	t.mu.Unlock()
	r.HonestReconciliationRequired = rec.reconciliationRequired
	r.WriteFailures = rec.writeFailures
	honest := handoffSamples(rec.releases, rec.fenceAt, false)
	spans := rec.spans
	if rec.open != nil {
		spans = append(slices.Clone(spans), holderSpan{tenant: rec.open.tenant, start: rec.open.start, end: time.Now()})
	}
	waits := make([]timedSample, len(rec.waits))
	adjusted := make([]timedSample, len(rec.waits))
	for i, w := range rec.waits {
		waits[i] = timedSample{w.start, w.end, w.end.Sub(w.start)}
		adjusted[i] = timedSample{w.start, w.end, withoutTenantHolds(w, spans)}
	}
	r.windowFigures(rec, honest, waits)
	qh, hh := r.pools(honest, false)
	qf, hf := r.pools(rec.floor, false)
	floor := slowdownOf(qf, hf)
	r.Floor, r.FloorError = splitDist{Quiet: floor.quiet, Hostile: floor.hostile}, rec.floorErr
	r.Handoffs = splitDist{Quiet: summarize(qh), Hostile: summarize(flat(hh))}
	_, th := r.pools(handoffSamples(rec.releases, rec.fenceAt, true), false)
	r.TenantHandoffs = summarize(flat(th))
	qw, hw := r.pools(waits, true)
	_, ha := r.pools(adjusted, true)
	r.Waits = splitDist{Quiet: summarize(qw), Hostile: summarize(flat(hw))}
	r.WaitsWithoutTenantHolds = summarize(flat(ha))
	r.Acquisitions = acquisitions{Served: len(rec.waits), Refused: len(rec.refusals), Reasons: map[string]int{}}
	for _, x := range rec.refusals {
		r.Acquisitions.Reasons[x.reason]++
	}
	r.memory(rec.rssPoints)
	for _, c := range rec.claimPoints {
		r.ClaimsPeak = max(r.ClaimsPeak, c.count)
	}
	r.Checks = []soakCheck{
		floor.againstFloor(checkTail("honest handoff p99", qh, hh)),
		checkAgainstFloor("honest handoff p99 against the floor", qh, hh, floor),
		r.checkIssuing(),
		floor.againstFloor(checkWait(qw, ha)),
		checkAgainstFloor("honest wait against the floor", qw, ha, floor),
		r.checkAcquisitions(),
		r.checkOdd(),
		r.checkGrowth(),
		r.checkClimb(),
		r.checkCleanup(),
		r.checkLeases(),
		r.checkWrongPod(),
	}
	r.Verdict = overall(r.Checks)
}

// timingChecks are the checks judged by time, not by what happened.
var timingChecks = []string{"honest handoff p99", "honest handoff p99 against the floor", "issuing on the honest lock",
	"honest wait behind the tenant", "honest wait against the floor"}

// reportTiming turns the timing checks' results into REPORTED (the figures
// stay) and judges the run on the others.
func (r *soakResult) reportTiming() {
	for i, c := range r.Checks {
		if slices.Contains(timingChecks, c.Name) {
			r.Checks[i].Detail = strings.TrimSpace(c.Detail + " (" + c.Result + " in a full run's terms; not judged here)")
			r.Checks[i].Result = verdictReported
		}
	}
	r.Verdict = overall(r.Checks)
}

// baseline reports whether a window is part of the quiet baseline: before
// the tenant sent anything, or after everything it created was deleted.
func baseline(kind string) bool { return kind == windowQuiet || kind == windowAfterCleanup }

// windowOf is the index of the window at t, -1 outside every window.
func (r *soakResult) windowOf(t time.Time) int {
	for i, w := range r.Windows {
		if !t.Before(w.Start) && t.Before(w.End) {
			return i
		}
	}
	return -1
}

// pools sorts samples into the quiet baseline (pooled) and the hostile
// windows (one slice each). A sample belongs to the window it started in;
// with byOverlap (waits, which last seconds), one that overlaps a hostile
// window belongs to the first it overlaps, and one that started in a
// baseline window counts there only if it ended in it too.
func (r *soakResult) pools(samples []timedSample, byOverlap bool) (quiet []time.Duration, hostile [][]time.Duration) {
	idx := map[int]int{}
	for i, w := range r.Windows {
		if w.Kind == windowHostile {
			idx[i] = len(hostile)
			hostile = append(hostile, nil)
		}
	}
	for _, s := range samples {
		i := r.windowOf(s.at)
		if byOverlap {
			i = r.overlapWindow(s)
		}
		switch {
		case i < 0:
		case r.Windows[i].Kind == windowHostile:
			hostile[idx[i]] = append(hostile[idx[i]], s.d)
		case baseline(r.Windows[i].Kind):
			quiet = append(quiet, s.d)
		}
	}
	return quiet, hostile
}

// overlapWindow: the first hostile window s overlaps, else the window s
// started in if it ended there too, else -1.
func (r *soakResult) overlapWindow(s timedSample) int {
	for i, w := range r.Windows {
		if w.Kind == windowHostile && s.at.Before(w.End) && s.end.After(w.Start) {
			return i
		}
	}
	if i := r.windowOf(s.at); i >= 0 && s.end.Before(r.Windows[i].End) {
		return i
	}
	return -1
}

func (r *soakResult) windowFigures(rec *soakRecorder, handoffs, waits []timedSample) {
	per := func(samples []timedSample) [][]time.Duration {
		out := make([][]time.Duration, len(r.Windows))
		for _, s := range samples {
			if i := r.windowOf(s.at); i >= 0 {
				out[i] = append(out[i], s.d)
			}
		}
		return out
	}
	h, w, f := per(handoffs), per(waits), per(rec.floor)
	for i := range r.Windows {
		win := &r.Windows[i]
		win.Handoffs, win.Waits, win.Floor = summarize(h[i]), summarize(w[i]), summarize(f[i])
		for f, at := range rec.fenceAt {
			if r.windowOf(at) == i {
				win.Issued++
				win.LastFence = max(win.LastFence, f)
			}
		}
		if s := win.End.Sub(win.Start).Seconds(); s > 0 {
			win.IssuedPerSecond = round2(float64(win.Issued) / s)
		}
		for _, x := range rec.refusals {
			if r.windowOf(x.at) == i {
				win.Refused++
			}
		}
		for _, p := range rec.rssPoints {
			if p.at.Before(win.End) {
				win.RSSEndMiB, win.AnonEndMiB = mib(p.rss), mib(p.anon)
			}
		}
		for _, c := range rec.claimPoints {
			if c.at.Before(win.End) {
				win.Claims = c.count
			}
		}
	}
}

func flat(xs [][]time.Duration) []time.Duration {
	var out []time.Duration
	for _, x := range xs {
		out = append(out, x...)
	}
	return out
}

// memory: RSS and anonymous memory at the start of the first quiet window,
// their peaks from then on, and their course after cleanup.
func (r *soakResult) memory(points []rssPoint) {
	var from, settle time.Time
	for _, w := range r.Windows {
		if w.Kind == windowQuiet && from.IsZero() {
			from = w.Start
		}
		if w.Kind == windowSettle {
			settle = w.Start
		}
	}
	r.Memory.RSS = r.course(points, from, settle, func(p rssPoint) uint64 { return p.rss })
	r.Memory.Anon = r.course(points, from, settle, func(p rssPoint) uint64 { return p.anon })
}

func (r *soakResult) course(points []rssPoint, from, settle time.Time, figure func(rssPoint) uint64) rssCourse {
	var m rssCourse
	var after []float64
	for _, p := range points {
		if p.at.Before(from) {
			continue
		}
		v := mib(figure(p))
		if m.QuietStartMiB == 0 {
			m.QuietStartMiB = v
		}
		if v > m.PeakMiB {
			m.PeakMiB = v
			m.PeakWindow = "lease check"
			if i := r.windowOf(p.at); i >= 0 {
				m.PeakWindow = r.Windows[i].Kind
			}
		}
		if !settle.IsZero() && !p.at.Before(settle) {
			after = append(after, v)
		}
	}
	m.GrowthMiB = round2(m.PeakMiB - m.QuietStartMiB)
	m.AfterCleanupSamples = len(after)
	if len(after) >= 10 {
		m.AfterCleanupFirstMiB, m.AfterCleanupLastMiB = round2(mean(after[:5])), round2(mean(after[len(after)-5:]))
	}
	return m
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
