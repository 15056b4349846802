package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// nontargetResult: what registry-keyed protection costs writes to objects
// that are nobody's target. One run, one control plane, the same
// client and the same open-loop schedule for every kind of write.
type nontargetResult struct {
	EntriesRequested int `json:"entries_requested"`
	// Entries: FencedResources with a ConfigMap target in the enrolled
	// namespace when the writes were measured; Untargeted: entries without a
	// target that -nontarget-fill added to reach EntriesRequested.
	Entries     int     `json:"entries_with_target"`
	Untargeted  int     `json:"entries_without_target"`
	FillSeconds float64 `json:"fill_seconds"`
	// SetupBudget: -nontarget-setup-budget; SetupCutShort says it ended the load.
	SetupBudget   string  `json:"setup_budget"`
	SetupCutShort bool    `json:"setup_cut_short"`
	SetupSeconds  float64 `json:"setup_seconds"`
	// SetupError: the create that failed after retries (webhook timeouts as
	// the namespace fills up); loading stopped there and the run measured
	// with the entries that existed.
	SetupError string `json:"setup_error,omitempty"`
	// CreateFirst/CreateLast: creating one FencedResource with a target (its
	// webhook takes the target's claim and asks its cache's index for other
	// entries of that target), over the first and the last tenth of the
	// entries: the two must not drift apart as the namespace fills.
	CreateFirst dist    `json:"create_first_tenth"`
	CreateLast  dist    `json:"create_last_tenth"`
	Rate        float64 `json:"rate_per_second"`
	// Unprotected: (a) a ConfigMap in a namespace without FencedResources.
	Unprotected dist `json:"unprotected_plain_namespace"`
	// NonTarget: (b) the same ConfigMap, in the enrolled namespace.
	NonTarget dist `json:"nontarget_enrolled_namespace"`
	// NamesEntry: a non-target whose fencekeeper.dev/resource annotation names
	// an entry (the webhook GETs that entry to find it targets something else).
	NamesEntry dist `json:"nontarget_naming_an_entry"`
	// Protected: (c) a fenced write to a target, in the enrolled namespace.
	Protected dist `json:"protected"`
	// RegistryGet: (d) a client's GET of one of the entries, same schedule.
	RegistryGet dist `json:"registry_get"`
	// UnprotectedCreate, NonTargetCreate: creates of new ConfigMaps, in the
	// namespace without FencedResources and in the enrolled one. The
	// webhook's index does not know a new object, so it asks the API server
	// whether an entry not in its cache yet protects it: that question must
	// not grow with the namespace's entries.
	UnprotectedCreate  dist    `json:"unprotected_create"`
	NonTargetCreate    dist    `json:"nontarget_create"`
	NonTargetCreateP99 float64 `json:"p99_ratio_nontarget_create_over_unprotected_create"`
	NonTargetCreateLim float64 `json:"nontarget_create_p99_limit_ms"` // unprotected create p99 + registry GET p99
	NonTargetP99       float64 `json:"p99_ratio_nontarget_over_unprotected"`
	NonTargetP50       float64 `json:"p50_ratio_nontarget_over_unprotected"`
	NamesEntryP99      float64 `json:"p99_ratio_naming_entry_over_unprotected"`
	ProtectedP99       float64 `json:"p99_ratio_protected_over_unprotected"`
	ProtectedP50       float64 `json:"p50_ratio_protected_over_unprotected"`
	NonTargetLimit     float64 `json:"nontarget_p99_limit_ms"`
	// NonTargetReps, NonTargetCreateReps: each repetition's p99 over its
	// limit (the tail rule's repetitions; ≤ 1 is within it).
	NonTargetReps       []float64 `json:"nontarget_p99_over_limit_reps"`
	NonTargetCreateReps []float64 `json:"nontarget_create_p99_over_limit_reps"`
	// EnrolledCalls: UPDATE calls of vprotected-enrolled the API server made
	// while measuring, with their duration as it measured them (interpolated
	// within histogram buckets) — the proof that (b) reached the webhook.
	EnrolledCalls   float64 `json:"vprotected_enrolled_update_calls"`
	EnrolledCallP50 float64 `json:"vprotected_enrolled_call_p50_ms"`
	EnrolledCallP99 float64 `json:"vprotected_enrolled_call_p99_ms"`
	// NotProtected: the operator's NOT_PROTECTED decisions while measuring.
	NotProtected float64 `json:"not_protected_decisions"`
}

// plainConfigMap is a ConfigMap nobody protects, updated with the same kind
// of change as the fenced pairs (the seq key, a 512-byte payload). With alt
// set, each update also swaps its annotations with alt, so a write changes
// them as a fenced segment changes its fence and receipt log.
type plainConfigMap struct {
	kube client.Client
	mu   sync.Mutex
	cm   *corev1.ConfigMap
	alt  map[string]string
	seq  int
}

// newPlainConfigMaps creates ConfigMaps prefix-0… in ns, one per entry of
// annotations (nil: no annotations); each swaps its annotations with the next
// one's on every update (see plainConfigMap.alt) when there are any.
func newPlainConfigMaps(ctx context.Context, kube client.Client, ns, prefix string, annotations []map[string]string) ([]*plainConfigMap, error) {
	var out []*plainConfigMap
	for i, ann := range annotations {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", prefix, i), Annotations: maps.Clone(ann)},
			Data: map[string]string{"seq": "0", "payload": strings.Repeat("x", 512)}}
		if err := kube.Create(ctx, cm); err != nil {
			return nil, fmt.Errorf("create ConfigMap %s/%s: %w", ns, cm.Name, err)
		}
		out = append(out, &plainConfigMap{kube: kube, cm: cm, alt: maps.Clone(annotations[(i+1)%len(annotations)])})
	}
	return out, nil
}

func (p *plainConfigMap) update(ctx context.Context) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cm := p.cm.DeepCopy()
	p.seq++
	cm.Data["seq"] = strconv.Itoa(p.seq)
	alt := p.alt
	if alt != nil {
		cm.Annotations, alt = alt, cm.Annotations
	}
	t := time.Now()
	err := p.kube.Update(ctx, cm)
	d := time.Since(t)
	if err != nil {
		return 0, fmt.Errorf("update %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	p.cm, p.alt = cm, alt
	return d, nil
}

// newConfigMaps creates a new ConfigMap in ns on every call (the same
// 512-byte payload as the updates).
func newConfigMaps(kube client.Client, ns string) request {
	var n atomic.Int64
	return func(ctx context.Context, _ int) (time.Duration, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("new-%d", n.Add(1))},
			Data: map[string]string{"payload": strings.Repeat("x", 512)}}
		t := time.Now()
		err := kube.Create(ctx, cm)
		d := time.Since(t)
		if err != nil {
			return 0, fmt.Errorf("create %s/%s: %w", ns, cm.Name, err)
		}
		return d, nil
	}
}

func plainRequests(cms []*plainConfigMap) request {
	return func(ctx context.Context, i int) (time.Duration, error) { return cms[i%len(cms)].update(ctx) }
}

func (r *report) nontarget(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const plainNS, enrolledNS = "bench-plain", "bench-enrolled"
	for _, ns := range []string{plainNS, enrolledNS} {
		if err := e.namespace(ctx, ns); err != nil {
			return err
		}
	}
	lc, kube, err := e.worker(ctx, enrolledNS)
	if err != nil {
		return err
	}
	// The fenced pairs' FencedResources have targets: creating them enrolls
	// the namespace.
	pairs, release, err := newFencedPairs(ctx, e, enrolledNS, 4, lc, kube)
	if err != nil {
		return err
	}
	defer release()
	plain, err := newPlainConfigMaps(ctx, kube, plainNS, "plain", make([]map[string]string, 4))
	if err != nil {
		return err
	}
	enrolled, err := newPlainConfigMaps(ctx, kube, enrolledNS, "plain", make([]map[string]string, 4))
	if err != nil {
		return err
	}
	x := &nontargetResult{EntriesRequested: cfg.ntEntries, SetupBudget: cfg.ntBudget.String(), Rate: cfg.ntRate}
	r.NonTarget = x
	names, err := x.fill(ctx, e, cfg, enrolledNS, log)
	if err != nil {
		return err
	}
	if err := e.operatorIdle(ctx, time.Minute); err != nil {
		fmt.Fprintf(log, "   %v; measuring anyway\n", err)
	}

	get := func(ctx context.Context, _ int) (time.Duration, error) {
		var fr locksv1.FencedResource
		key := client.ObjectKey{Namespace: enrolledNS, Name: names[rand.IntN(len(names))]}
		t := time.Now()
		err := kube.Get(ctx, key, &fr)
		return time.Since(t), err
	}
	pair := func(k int) request {
		return func(ctx context.Context, i int) (time.Duration, error) { return pairs[i%len(pairs)].update(ctx, k) }
	}
	// (a) unprotected, (b) non-target, non-target naming an entry, (c)
	// protected, (d) registry GET, then creates: unprotected, non-target.
	kinds := []request{plainRequests(plain), plainRequests(enrolled), pair(1), pair(0), get,
		newConfigMaps(kube, plainNS), newConfigMaps(kube, enrolledNS)}
	if _, err := openLoop(ctx, cfg.ntRate, 10, kinds...); err != nil { // warm-up
		return err
	}
	opBefore, _ := e.op.Metrics(ctx)
	apiBefore, _ := e.apiserverMetrics(ctx)
	// The tail rule's repetitions: successive open loops, each with every
	// kind interleaved; the verdicts are judged per repetition, the
	// distributions printed are all repetitions pooled.
	pooled := make([][]time.Duration, len(kinds))
	for rep := 0; rep < repetitionCount; rep++ {
		out, err := openLoop(ctx, cfg.ntRate, max(1, cfg.ntSamples/repetitionCount), kinds...)
		if err != nil {
			return err
		}
		for k := range out {
			pooled[k] = append(pooled[k], out[k]...)
		}
		x.addRepetition(summarize(out[0]), summarize(out[1]), summarize(out[4]), summarize(out[5]), summarize(out[6]))
	}
	out := pooled
	x.Unprotected, x.NonTarget, x.NamesEntry, x.Protected, x.RegistryGet =
		summarize(out[0]), summarize(out[1]), summarize(out[2]), summarize(out[3]), summarize(out[4])
	x.UnprotectedCreate, x.NonTargetCreate = summarize(out[5]), summarize(out[6])
	x.webhookEvidence(ctx, e, opBefore, apiBefore)
	x.judge(r)
	fmt.Fprintf(log, "   p99 ms: unprotected %s, non-target %s, naming an entry %s, protected %s, registry GET %s; creates: unprotected %s, non-target %s\n",
		fmtF(x.Unprotected.P99), fmtF(x.NonTarget.P99), fmtF(x.NamesEntry.P99), fmtF(x.Protected.P99), fmtF(x.RegistryGet.P99),
		fmtF(x.UnprotectedCreate.P99), fmtF(x.NonTargetCreate.P99))
	return nil
}

// fill creates the enrolled namespace's entries (see loadEntries): with a
// target until the budget is spent, then, with -nontarget-fill, without one
// up to -nontarget-entries. It returns the names of all of them.
func (x *nontargetResult) fill(ctx context.Context, e *env, cfg *config, ns string, log io.Writer) ([]string, error) {
	t := time.Now()
	names, creates, err := e.loadEntries(ctx, ns, "nt-", cfg.ntEntries, cfg.ntBudget, true, cfg.loaders, log)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err != nil {
		x.SetupError = err.Error()
		fmt.Fprintf(log, "   loading stopped: %v\n", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no entries created: %w", err)
	}
	x.SetupSeconds, x.Entries = round2(time.Since(t).Seconds()), len(creates)
	x.SetupCutShort = x.Entries < x.EntriesRequested
	tenth := max(1, len(creates)/10)
	x.CreateFirst, x.CreateLast = summarize(creates[:tenth]), summarize(creates[len(creates)-tenth:])
	fmt.Fprintf(log, "   %d of %d entries with a target in %.0fs (FencedResource+target create p50 %s ms first tenth, %s ms last tenth)\n",
		x.Entries, x.EntriesRequested, x.SetupSeconds, fmtF(x.CreateFirst.P50), fmtF(x.CreateLast.P50))
	if fill := cfg.ntEntries - len(names); cfg.ntFill && fill > 0 {
		t := time.Now()
		more, _, err := e.loadEntries(ctx, ns, "nu-", fill, 0, false, cfg.loaders, log)
		if err != nil {
			return nil, fmt.Errorf("entries without a target: %w", err)
		}
		x.Untargeted, x.FillSeconds = len(more), round2(time.Since(t).Seconds())
		names = append(names, more...)
		fmt.Fprintf(log, "   %d entries without a target in %.0fs\n", x.Untargeted, x.FillSeconds)
	}
	return names, nil
}

// webhookEvidence records, from the API server's and the operator's metrics,
// that the enrolled namespace's non-targets reached the webhook.
func (x *nontargetResult) webhookEvidence(ctx context.Context, e *env, opBefore, apiBefore string) {
	if apiAfter, err := e.apiserverMetrics(ctx); err == nil {
		h := histogramDelta(apiAfter, apiBefore, "apiserver_admission_webhook_admission_duration_seconds",
			`name="vprotected-enrolled.fencekeeper.dev"`, `operation="UPDATE"`)
		if len(h.counts) > 0 {
			x.EnrolledCalls = h.counts[len(h.counts)-1]
		}
		x.EnrolledCallP50, x.EnrolledCallP99 = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3
	}
	if opAfter, err := e.op.Metrics(ctx); err == nil {
		x.NotProtected = counterDelta(opAfter, opBefore, "fencekeeper_admission_decisions_total", `verdict="NOT_PROTECTED"`)
	}
}

// Per-repetition limits. A non-target update in an enrolled namespace may
// cost what one webhook round trip answered from the cache costs, within the
// noise of the baseline: p99 ≤ unprotected p99 × 1.5 + 1 ms. A create the
// index cannot answer reads one object around the webhook's cache (the
// target claim), which may cost what a registry GET costs, and nothing that
// grows with the namespace's entries: p99 ≤ unprotected create p99 +
// registry GET p99.
func nonTargetLimit(unprotected dist) float64 { return unprotected.P99*1.5 + 1 }
func nonTargetCreateLimit(unprotectedCreate, get dist) float64 {
	return unprotectedCreate.P99 + get.P99
}

// addRepetition records one repetition's p99s against their limits.
func (x *nontargetResult) addRepetition(unprotected, nonTarget, get, unprotectedCreate, nonTargetCreate dist) {
	x.NonTargetReps = append(x.NonTargetReps, ratio(nonTarget.P99, nonTargetLimit(unprotected)))
	x.NonTargetCreateReps = append(x.NonTargetCreateReps, ratio(nonTargetCreate.P99, nonTargetCreateLimit(unprotectedCreate, get)))
}

// judge judges both lines by the tail rule on the per-repetition ratios to
// their limits; the pooled figures are the detail.
func (x *nontargetResult) judge(r *report) {
	x.NonTargetP99, x.NonTargetP50 = ratio(x.NonTarget.P99, x.Unprotected.P99), ratio(x.NonTarget.P50, x.Unprotected.P50)
	x.NamesEntryP99 = ratio(x.NamesEntry.P99, x.Unprotected.P99)
	x.ProtectedP99, x.ProtectedP50 = ratio(x.Protected.P99, x.Unprotected.P99), ratio(x.Protected.P50, x.Unprotected.P50)
	x.NonTargetLimit = round2(nonTargetLimit(x.Unprotected))
	r.judgeTail(fmt.Sprintf("non-target write, %d entries (%d with a target)", x.Entries+x.Untargeted, x.Entries),
		"non-target p99 ≤ unprotected p99 × 1.5 + 1 ms, per repetition (as the ratio)", x.NonTargetReps, atMost(1), "×",
		fmt.Sprintf("ConfigMap updates at %g/s (all kinds), all repetitions pooled: non-target in the enrolled namespace p50/p99 %s/%s ms, unprotected (no FencedResources) %s/%s ms (limit %s ms); p99 ratio %s×",
			x.Rate, fmtF(x.NonTarget.P50), fmtF(x.NonTarget.P99), fmtF(x.Unprotected.P50), fmtF(x.Unprotected.P99), fmtF(x.NonTargetLimit), fmtF(x.NonTargetP99)))
	x.NonTargetCreateP99 = ratio(x.NonTargetCreate.P99, x.UnprotectedCreate.P99)
	x.NonTargetCreateLim = round2(nonTargetCreateLimit(x.UnprotectedCreate, x.RegistryGet))
	r.judgeTail(fmt.Sprintf("non-target create, %d entries (%d with a target)", x.Entries+x.Untargeted, x.Entries),
		"non-target p99 ≤ unprotected create p99 + registry GET p99, per repetition (as the ratio)", x.NonTargetCreateReps, atMost(1), "×",
		fmt.Sprintf("ConfigMap creates (the webhook's index knows no new object; it reads the target claim), all repetitions pooled: non-target in the enrolled namespace p50/p99 %s/%s ms, unprotected %s/%s ms (limit %s ms); p99 ratio %s×",
			fmtF(x.NonTargetCreate.P50), fmtF(x.NonTargetCreate.P99), fmtF(x.UnprotectedCreate.P50), fmtF(x.UnprotectedCreate.P99), fmtF(x.NonTargetCreateLim), fmtF(x.NonTargetCreateP99)))
}

// loadEntries creates n FencedResources prefix00000…, with a ConfigMap
// target each if targeted (the ConfigMaps need not exist), `loaders` at a
// time, until all exist or the budget (0: none) is spent. It returns the entries created and each
// create's latency, in order of creation; a create that fails after retries
// stops the load and is returned with what was created. A targeted create
// also takes its target's claim (a Lease in the operator's namespace), so it
// costs a write more than an entry without a target.
func (e *env) loadEntries(ctx context.Context, ns, prefix string, n int, budget time.Duration, targeted bool, loaders int, log io.Writer) ([]string, []time.Duration, error) {
	start := time.Now()
	var (
		next    atomic.Int64
		done    atomic.Int64
		mu      sync.Mutex
		creates []time.Duration
		names   []string
		wg      sync.WaitGroup
	)
	var (
		stop     atomic.Bool
		firstErr error
	)
	for l := 0; l < loaders; l++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil || stop.Load() || (budget > 0 && time.Since(start) > budget) {
					return
				}
				t := time.Now()
				name, target := fmt.Sprintf("%s%05d", prefix, i), ""
				if targeted {
					target = name + "-cm"
				}
				if err := retry(ctx, func() error {
					return client.IgnoreAlreadyExists(e.fencedResource(ctx, ns, name, 3600, target))
				}); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("create FencedResource %s after %s: %w", name, time.Since(t).Round(time.Millisecond), err)
					}
					mu.Unlock()
					stop.Store(true)
					return
				}
				d := time.Since(t)
				mu.Lock()
				creates, names = append(creates, d), append(names, name)
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-finished:
			return names, creates, firstErr
		case <-tick.C:
			fmt.Fprintf(log, "   … %d of %d entries (%.0fs)\n", done.Load(), n, time.Since(start).Seconds())
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// operatorIdle waits until the operator's work queues are empty, so the
// measurement does not compete with reconciles of the entries just created.
func (e *env) operatorIdle(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		text, err := e.op.Metrics(ctx)
		if err != nil {
			return err
		}
		depth := 0.0
		for series, v := range parseMetrics(text) {
			if strings.HasPrefix(series, "workqueue_depth{") {
				depth += v
			}
		}
		if depth == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("operator work queues still hold %.0f items after %s", depth, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// counterDelta sums the series of counter name that match every filter,
// after minus before.
func counterDelta(after, before, name string, filters ...string) float64 {
	sum := func(text string) float64 {
		total := 0.0
		for series, v := range parseMetrics(text) {
			if !strings.HasPrefix(series, name+"{") {
				continue
			}
			ok := true
			for _, f := range filters {
				ok = ok && strings.Contains(series, f)
			}
			if ok {
				total += v
			}
		}
		return total
	}
	return sum(after) - sum(before)
}

func (x *nontargetResult) print(out io.Writer, section func(string), row func(...any), flush func()) {
	cut := ""
	if x.SetupCutShort {
		cut = fmt.Sprintf(", setup budget %s reached", x.SetupBudget)
	}
	section(fmt.Sprintf("6. Non-target writes: ConfigMap updates, enrolled namespace with %d FencedResources (%d with a target, of %d requested%s; %d without), %g requests/s all kinds (ms)",
		x.Entries+x.Untargeted, x.Entries, x.EntriesRequested, cut, x.Untargeted, x.Rate))
	row("kind", "n", "p50", "p90", "p99", "max", "p50 ratio", "p99 ratio")
	kind := func(name string, d dist) {
		row(name, d.N, d.P50, d.P90, d.P99, d.Max, ratio(d.P50, x.Unprotected.P50), ratio(d.P99, x.Unprotected.P99))
	}
	kind("(a) unprotected: namespace without FencedResources", x.Unprotected)
	kind("(b) non-target, enrolled namespace", x.NonTarget)
	kind("non-target naming an entry (annotation)", x.NamesEntry)
	kind("(c) protected (fenced)", x.Protected)
	kind("(d) registry GET (a FencedResource)", x.RegistryGet)
	row("create, unprotected namespace", x.UnprotectedCreate.N, x.UnprotectedCreate.P50, x.UnprotectedCreate.P90, x.UnprotectedCreate.P99, x.UnprotectedCreate.Max, 1.0, 1.0)
	row("create, non-target in the enrolled namespace", x.NonTargetCreate.N, x.NonTargetCreate.P50, x.NonTargetCreate.P90, x.NonTargetCreate.P99, x.NonTargetCreate.Max,
		ratio(x.NonTargetCreate.P50, x.UnprotectedCreate.P50), x.NonTargetCreateP99)
	flush()
	if x.SetupError != "" {
		fmt.Fprintf(out, "setup stopped by a failed create: %s\n", x.SetupError)
	}
	fmt.Fprintf(out, "setup: %d entries with a target in %s s, %d without in %s s; FencedResource+target create p50/p99 %s/%s ms (first tenth), %s/%s ms (last tenth)\n",
		x.Entries, fmtF(x.SetupSeconds), x.Untargeted, fmtF(x.FillSeconds), fmtF(x.CreateFirst.P50), fmtF(x.CreateFirst.P99), fmtF(x.CreateLast.P50), fmtF(x.CreateLast.P99))
	fmt.Fprintf(out, "vprotected-enrolled UPDATE calls while measuring: %.0f (API server's view p50≈%s ms, p99≈%s ms); operator NOT_PROTECTED decisions: %.0f\n",
		x.EnrolledCalls, fmtF(x.EnrolledCallP50), fmtF(x.EnrolledCallP99), x.NotProtected)
}
