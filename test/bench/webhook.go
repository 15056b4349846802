package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

type webhookResult struct {
	Pairs   int           `json:"configmap_pairs"`
	Rates   []webhookRate `json:"rates"`
	samples []webhookSamples
	// Updates: the webhook's time over the phase's updates, from the
	// operator's and the API server's histograms (the call to vprotected
	// only).
	Updates webhookTimes `json:"webhook_updates"`
	// RegistryGetAlone: a client's GET of a FencedResource on an otherwise
	// quiet API server, sequential at RegistryGetRate (for comparison; the
	// targets use each rate's interleaved RegistryGet).
	RegistryGetAlone dist    `json:"registry_get_alone"`
	RegistryGetRate  float64 `json:"registry_get_alone_rate_per_second"`
	// FenceStatePlain/Weighted: what the stored fence state of a protected
	// write costs the API server by itself (see fenceStateCost), measured at
	// RegistryGetRate. Not judged.
	FenceStatePlain    dist `json:"fence_state_plain"`
	FenceStateWeighted dist `json:"fence_state_weighted"`
	FenceStateBytes    int  `json:"fence_state_bytes"`
}

// webhookSamples: one rate's samples, for the plots.
type webhookSamples struct {
	rate                   float64
	protected, unprotected []time.Duration
}

type webhookRate struct {
	Rate        float64 `json:"rate_per_second"`
	Protected   dist    `json:"protected"`
	Unprotected dist    `json:"unprotected"`
	// RegistryGet: a client's GET of a FencedResource — the linearizable
	// read the contract requires of the webhook on every protected write —
	// interleaved with the updates, so it meets the same load as the read
	// inside the webhook does.
	RegistryGet dist    `json:"registry_get"`
	P99Ratio    float64 `json:"p99_ratio_protected_over_unprotected"`
	P50Ratio    float64 `json:"p50_ratio_protected_over_unprotected"`
	// OverheadReps and P99RatioReps: each repetition's protected p99 over
	// unprotected p99 + registry GET p99, and over unprotected p99.
	OverheadReps []float64 `json:"overhead_ratio_repetitions"`
	P99RatioReps []float64 `json:"p99_ratio_repetitions"`
}

// fencedPair is a protected ConfigMap written under a held grant, and an
// unprotected twin that receives the same change to its data (same size,
// same fencekeeper.dev/resource annotation), without the protected label and
// without fence state: the webhook refuses fence and receipt annotations on an
// object that is nobody's target. The twin's namespace holds FencedResources,
// so vprotected-enrolled still sends its writes to the webhook, which finds
// the entry the annotation names in its cache and reads nothing more, since
// that entry targets another object (section 6, nontarget.go, measures writes
// the webhook never sees).
type fencedPair struct {
	kube client.Client
	lock *lockclient.Lock
	op   string
	mu   [2]sync.Mutex
	cm   [2]*corev1.ConfigMap // 0 protected, 1 unprotected
	seg  [2]int64
	seq  [2]int
}

// newFencedPair registers FencedResource name (Enforce, 1 h lease so no
// renewal runs during the measurement), acquires it and writes segment 1.
// newFencedPairs makes n pairs named wh-0…; release gives their grants up.
func newFencedPairs(ctx context.Context, e *env, ns string, n int, lc *lockclient.Client, kube client.Client) (pairs []*fencedPair, release func(), err error) {
	release = func() {
		// Bounded: a run that failed may have no issuer left to confirm.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, p := range pairs {
			_ = p.lock.Release(rctx)
		}
	}
	for i := 0; i < n; i++ {
		p, err := newFencedPair(ctx, e, ns, fmt.Sprintf("wh-%d", i), lc, kube)
		if err != nil {
			release()
			return nil, nil, err
		}
		pairs = append(pairs, p)
	}
	return pairs, release, nil
}

func newFencedPair(ctx context.Context, e *env, ns, name string, lc *lockclient.Client, kube client.Client) (*fencedPair, error) {
	if err := e.fencedResource(ctx, ns, name, 3600, name+"-p"); err != nil {
		return nil, err
	}
	l, err := lc.Acquire(ctx, name, lockclient.AcquireOptions{})
	if err != nil {
		return nil, err
	}
	p := &fencedPair{kube: kube, lock: l, op: "bench-" + name}
	data := map[string]string{"seq": "0", "payload": strings.Repeat("x", 512)}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-p"}}
	if _, err := l.Operation(p.op).Commit(ctx, cm, func() error { cm.Data = maps.Clone(data); return nil }); err != nil {
		return nil, fmt.Errorf("first fenced write: %w", err)
	}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(cm), cm); err != nil {
		return nil, err
	}
	// The twin names the entry but is not its target, so it may carry no
	// fence state (the webhook refuses fence annotations on non-targets).
	twinAnnotations := maps.Clone(cm.Annotations)
	delete(twinAnnotations, fence.AnnotationFence)
	delete(twinAnnotations, fence.AnnotationReceipts)
	twin := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-u", Annotations: twinAnnotations}, Data: maps.Clone(cm.Data)}
	if err := kube.Create(ctx, twin); err != nil {
		return nil, err
	}
	p.cm = [2]*corev1.ConfigMap{cm, twin}
	p.seg = [2]int64{1, 1}
	return p, nil
}

// update writes the next segment to ConfigMap kind (0 protected, 1
// unprotected) and returns the latency of the update request alone.
func (p *fencedPair) update(ctx context.Context, kind int) (time.Duration, error) {
	p.mu[kind].Lock()
	defer p.mu[kind].Unlock()
	cm := p.cm[kind].DeepCopy()
	p.seq[kind]++
	cm.Data["seq"] = strconv.Itoa(p.seq[kind])
	payload, err := fence.PayloadDigest(fence.ConfigMapPayload(cm.Data, cm.BinaryData))
	if err != nil {
		return 0, err
	}
	if kind == 0 {
		g, proof := p.lock.Grant()
		ann := maps.Clone(cm.Annotations)
		if _, err := fence.Stamp(ann, fence.Envelope{Grant: g, Proof: proof, Operation: p.op, Segment: p.seg[kind] + 1, Payload: payload}); err != nil {
			return 0, err
		}
		cm.Annotations = ann
	}
	t := time.Now()
	err = p.kube.Update(ctx, cm)
	d := time.Since(t)
	if err != nil {
		return 0, fmt.Errorf("update %s: %w", cm.Name, err)
	}
	p.cm[kind], p.seg[kind] = cm, p.seg[kind]+1
	return d, nil
}

// interleaved sends n updates of each kind at rate (both kinds together),
// alternating protected and unprotected and rotating over the pairs (see
// openLoop).
func interleaved(ctx context.Context, pairs []*fencedPair, rate float64, n int) (prot, unprot []time.Duration, err error) {
	out, err := openLoop(ctx, rate, n, pairUpdates(pairs, 0), pairUpdates(pairs, 1))
	return out[0], out[1], err
}

// interleavedWithRead is interleaved plus a third kind at the same per-kind
// rate: a GET of the pairs' FencedResources (the registry read of a protected
// write), so the baseline the targets add meets the updates' load.
func interleavedWithRead(ctx context.Context, pairs []*fencedPair, reader client.Reader, ns string, rate float64, n int) (prot, unprot, gets []time.Duration, err error) {
	out, err := openLoop(ctx, rate*3/2, n, pairUpdates(pairs, 0), pairUpdates(pairs, 1), registryGets(reader, ns, len(pairs)))
	return out[0], out[1], out[2], err
}

// fenceStateCost measures what a protected write's stored fence state costs
// the API server alone, which the overhead rule's allowance (one registry GET)
// does not include: the contract puts the change, its fence annotation and the
// receipt log in one write. In a namespace without FencedResources (no
// webhook sees its writes) it updates, interleaved at rate, plain ConfigMaps
// like the twins and ConfigMaps that carry the pairs' fence and receipt
// annotations, which each write swaps for another pair's (a fenced segment
// changes both).
func (w *webhookResult) fenceStateCost(ctx context.Context, e *env, kube client.Client, pairs []*fencedPair, rate float64, n int) error {
	const ns = "bench-webhook-plain"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	state := make([]map[string]string, len(pairs))
	for i, p := range pairs {
		p.mu[0].Lock()
		ann := p.cm[0].Annotations
		p.mu[0].Unlock()
		state[i] = map[string]string{fence.AnnotationFence: ann[fence.AnnotationFence], fence.AnnotationReceipts: ann[fence.AnnotationReceipts]}
	}
	w.FenceStateBytes = len(state[0][fence.AnnotationFence]) + len(state[0][fence.AnnotationReceipts])
	plain, err := newPlainConfigMaps(ctx, kube, ns, "plain", make([]map[string]string, len(pairs)))
	if err != nil {
		return err
	}
	weighted, err := newPlainConfigMaps(ctx, kube, ns, "weighted", state)
	if err != nil {
		return err
	}
	kinds := []request{plainRequests(plain), plainRequests(weighted)}
	if _, err := openLoop(ctx, rate, 10, kinds...); err != nil { // warm-up
		return err
	}
	out, err := openLoop(ctx, rate, n, kinds...)
	if err != nil {
		return err
	}
	w.FenceStatePlain, w.FenceStateWeighted = summarize(out[0]), summarize(out[1])
	return nil
}

// registryGets is the request that GETs the pairs' FencedResources
// (wh-0…) in turn: the registry read of a protected write.
func registryGets(reader client.Reader, ns string, npairs int) request {
	return func(ctx context.Context, i int) (time.Duration, error) {
		var fr locksv1.FencedResource
		t := time.Now()
		err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("wh-%d", i%npairs)}, &fr)
		return time.Since(t), err
	}
}

// pairUpdates is the request that updates the pairs' ConfigMap kind in turn.
func pairUpdates(pairs []*fencedPair, kind int) request {
	return func(ctx context.Context, i int) (time.Duration, error) { return pairs[i%len(pairs)].update(ctx, kind) }
}

// request sends the i-th request of one kind and returns its latency.
type request func(ctx context.Context, i int) (time.Duration, error)

// openLoop sends n requests of each kind at rate (all kinds together),
// round-robin over the kinds so every kind sees the same conditions; each
// request is issued on schedule (open loop), so a slow answer does not slow
// the offered rate. out[k] holds kind k's latencies; err is the first failure.
func openLoop(ctx context.Context, rate float64, n int, kinds ...request) (out [][]time.Duration, err error) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	out = make([][]time.Duration, len(kinds))
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; i < len(kinds)*n; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return out, ctx.Err()
			case <-time.After(d):
			}
		}
		k, j := i%len(kinds), i/len(kinds)
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, rerr := kinds[k](ctx, j)
			mu.Lock()
			defer mu.Unlock()
			if rerr != nil {
				if err == nil {
					err = rerr
				}
				return
			}
			out[k] = append(out[k], d)
		}()
	}
	wg.Wait()
	return out, err
}

func (r *report) webhook(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const ns = "bench-webhook"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	lc, kube, err := e.worker(ctx, ns)
	if err != nil {
		return err
	}
	const npairs = 4
	pairs, release, err := newFencedPairs(ctx, e, ns, npairs, lc, kube)
	if err != nil {
		return err
	}
	defer release()
	// Warm-up: connections, the webhook's TLS session, caches.
	if _, _, err := interleaved(ctx, pairs, 50, 20); err != nil {
		return err
	}
	opBefore, _ := e.op.Metrics(ctx)
	apiBefore, _ := e.apiserverMetrics(ctx)
	w := &webhookResult{Pairs: npairs}
	r.Webhook = w
	for _, rate := range cfg.rates {
		// The tail rule's repetitions: successive open loops, each with the
		// three kinds interleaved.
		var prot, unprot, gets []time.Duration
		x := webhookRate{Rate: rate}
		for rep := 0; rep < repetitionCount; rep++ {
			p, u, g, err := interleavedWithRead(ctx, pairs, kube, ns, rate, max(1, cfg.webhookSamples/repetitionCount))
			if err != nil {
				return err
			}
			prot, unprot, gets = append(prot, p...), append(unprot, u...), append(gets, g...)
			ps, us, gs := summarize(p), summarize(u), summarize(g)
			x.OverheadReps = append(x.OverheadReps, ratio(ps.P99, us.P99+gs.P99))
			x.P99RatioReps = append(x.P99RatioReps, ratio(ps.P99, us.P99))
		}
		x.Protected, x.Unprotected, x.RegistryGet = summarize(prot), summarize(unprot), summarize(gets)
		w.samples = append(w.samples, webhookSamples{rate: rate, protected: prot, unprotected: unprot})
		x.P99Ratio = ratio(x.Protected.P99, x.Unprotected.P99)
		x.P50Ratio = ratio(x.Protected.P50, x.Unprotected.P50)
		w.Rates = append(w.Rates, x)
		fmt.Fprintf(log, "   %g/s: protected p99 %.2f ms, unprotected p99 %.2f ms, registry GET p99 %.2f ms\n", rate, x.Protected.P99, x.Unprotected.P99, x.RegistryGet.P99)
	}
	// The same read on a quiet API server, for comparison with the
	// interleaved ones the targets use.
	w.RegistryGetRate = cfg.rates[len(cfg.rates)/2]
	var gets []time.Duration
	interval := time.Duration(float64(time.Second) / w.RegistryGetRate)
	get := registryGets(kube, ns, npairs)
	for i := 0; i < max(50, cfg.webhookSamples/2); i++ {
		d, err := get(ctx, i)
		if err != nil {
			return err
		}
		gets = append(gets, d)
		time.Sleep(max(0, interval-d))
	}
	w.RegistryGetAlone = summarize(gets)
	if err := w.fenceStateCost(ctx, e, kube, pairs, w.RegistryGetRate, max(50, cfg.webhookSamples/2)); err != nil {
		return err
	}
	for _, x := range w.Rates {
		r.judgeTail(fmt.Sprintf("protected write @%g/s", x.Rate), "p99 ≤ unprotected p99 + registry GET p99, all interleaved (as the ratio)",
			x.OverheadReps, atMost(1), "×",
			fmt.Sprintf("%g updates/s interleaved with %g GETs/s, all repetitions pooled: protected p50/p99 %s/%s ms, unprotected %s/%s ms, registry GET %s/%s ms (alone: p99 %s ms)",
				x.Rate, x.Rate/2, fmtF(x.Protected.P50), fmtF(x.Protected.P99), fmtF(x.Unprotected.P50), fmtF(x.Unprotected.P99),
				fmtF(x.RegistryGet.P50), fmtF(x.RegistryGet.P99), fmtF(w.RegistryGetAlone.P99)))
		r.judgeTail(fmt.Sprintf("protected write against unprotected @%g/s", x.Rate), "p99 ≤ 2× the unprotected update's p99", x.P99RatioReps, atMost(2), "×",
			fmt.Sprintf("pooled: %s×", fmtF(x.P99Ratio)))
	}
	w.Updates = e.webhookTimesSince(ctx, opBefore, apiBefore, `name="vprotected.fencekeeper.dev"`)
	return nil
}

// webhookTimes is where the ConfigMap UPDATEs' webhook time went over a
// phase: p50 and p99 in ms, interpolated within the histograms' coarse
// buckets.
type webhookTimes struct {
	// HandlerP50/P99: the operator's fencekeeper_admission_duration_seconds.
	HandlerP50 float64 `json:"operator_handler_p50_ms"`
	HandlerP99 float64 `json:"operator_handler_p99_ms"`
	// ReadP50/P99: the handler's linearizable GET of the entry
	// (fencekeeper_admission_registry_read_seconds), which protected writes
	// make; Reads counts them.
	ReadP50 float64 `json:"operator_registry_read_p50_ms"`
	ReadP99 float64 `json:"operator_registry_read_p99_ms"`
	Reads   float64 `json:"operator_registry_reads"`
	// CallP50/P99: the API server's view of the call
	// (apiserver_admission_webhook_admission_duration_seconds).
	CallP50 float64 `json:"apiserver_webhook_call_p50_ms"`
	CallP99 float64 `json:"apiserver_webhook_call_p99_ms"`
}

// webhookTimesSince scrapes both processes again and keeps what the UPDATEs
// since opBefore and apiBefore added; callFilters pick the API server's
// webhook series. A figure whose scrape failed stays zero.
func (e *env) webhookTimesSince(ctx context.Context, opBefore, apiBefore string, callFilters ...string) webhookTimes {
	var w webhookTimes
	if after, err := e.op.Metrics(ctx); err == nil && opBefore != "" {
		h := histogramDelta(after, opBefore, "fencekeeper_admission_duration_seconds", `operation="UPDATE"`)
		w.HandlerP50, w.HandlerP99 = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3
		h = histogramDelta(after, opBefore, "fencekeeper_admission_registry_read_seconds")
		w.ReadP50, w.ReadP99, w.Reads = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3, h.total()
	}
	if after, err := e.apiserverMetrics(ctx); err == nil && apiBefore != "" {
		h := histogramDelta(after, apiBefore, "apiserver_admission_webhook_admission_duration_seconds", append([]string{`operation="UPDATE"`}, callFilters...)...)
		w.CallP50, w.CallP99 = h.quantile(0.5)*1e3, h.quantile(0.99)*1e3
	}
	return w
}

func (e *env) apiserverMetrics(ctx context.Context) (string, error) {
	raw, err := e.adminC.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	return string(raw), err
}

// histogram is a cumulative Prometheus histogram: upper bound → count.
type histogram struct {
	bounds []float64
	counts []float64
}

// histogramDelta sums the buckets of name whose series match every filter,
// after minus before.
func histogramDelta(after, before, name string, filters ...string) histogram {
	sum := func(text string) map[float64]float64 {
		out := map[float64]float64{}
		for series, v := range parseMetrics(text) {
			if !strings.HasPrefix(series, name+"_bucket{") {
				continue
			}
			ok := true
			for _, f := range filters {
				ok = ok && strings.Contains(series, f)
			}
			if !ok {
				continue
			}
			le := parseLabels(series)["le"]
			b, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				b, err = math.Inf(1), nil
			}
			if err == nil {
				out[b] += v
			}
		}
		return out
	}
	a, b := sum(after), sum(before)
	var h histogram
	for bound := range a {
		h.bounds = append(h.bounds, bound)
	}
	sort.Float64s(h.bounds)
	for _, bound := range h.bounds {
		h.counts = append(h.counts, a[bound]-b[bound])
	}
	return h
}

// total is the number of observations (the +Inf bucket).
func (h histogram) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile interpolates linearly within the bucket holding q (as
// Prometheus' histogram_quantile does).
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return math.NaN()
	}
	total := h.counts[len(h.counts)-1]
	rank := q * total
	lower, below := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			upper := h.bounds[i]
			if math.IsInf(upper, 1) {
				return lower
			}
			if c == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(c-below)
		}
		lower, below = h.bounds[i], c
	}
	return h.bounds[len(h.bounds)-1]
}
