package main

// The PostgreSQL store through the lock, on the embedded control plane with
// the real operator (cmd/manager as a child process, as make bench runs it)
// publishing to the bench's PostgreSQL:
//
//   - P4: the time from HELD (lockclient's Acquire returned) to the grant's
//     first accepted segment. CommitTx waits until the operator published
//     the grant to the store (it polls fencekeeper.published); the same
//     grant's second CommitTx, which waits for nothing, is the control.
//     Samples come from a chain of uncontended acquisitions and from
//     handoffs between two workers, each queued behind the other.
//   - P5: eight workers on ONE resource, each looping acquire (FIFO) → read
//     the business row → CommitTx the row + 1 → release, against eight
//     workers on one row of a plain table taking the database's own lock
//     (SELECT … FOR UPDATE), windows alternating. Judged: no lost update
//     (the row equals the acknowledged commits, and every commit's fence
//     is higher than the one before it in commit order). The throughput
//     ratio is reported, not judged: every handoff of the lock goes
//     through the API server and the operator, the control's through one
//     PostgreSQL row lock.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// The lock passes' namespace, FencedResources (their resourceIDs are
// namespace/name) and tables.
const (
	pgLockNS        = "pgstore-lock"
	pgLockSecret    = "pgstore"
	pgPublishFR     = "publish"
	pgContendedFR   = "contended"
	pgLockLease     = 10 // seconds: the workers release long before
	pgPublishTable  = "lock_publish"
	pgCounterTable  = "lock_counter"
	pgCommitsTable  = "lock_commits"
	pgPlainCounter  = "plain_counter"
	pgPlainCommits  = "plain_commits"
	pgMetricPublish = "fencekeeper_store_publish_duration_seconds"
)

// pgPublication is P4: HELD → first accepted segment, and its control.
type pgPublication struct {
	// First: Acquire returned → the grant's first CommitTx returned with its
	// receipt, over every handoff; Chain and Queued split it by how the
	// grant came (uncontended acquisition, or handed off on the previous
	// holder's release to a worker queued behind it).
	First  dist `json:"first_commit"`
	Chain  dist `json:"first_commit_uncontended"`
	Queued dist `json:"first_commit_queued"`
	// Second: the same grant's second CommitTx (no publication wait, no
	// state read: the lock knows where its grant stands).
	Second dist `json:"second_commit"`
	// DiffP50, DiffP99: First minus Second, at p50 and p99 (ms).
	DiffP50 float64 `json:"first_minus_second_p50_ms"`
	DiffP99 float64 `json:"first_minus_second_p99_ms"`
	// Acquire and Release: the lockclient calls themselves.
	Acquire dist `json:"acquire"`
	Release dist `json:"release"`
	// PublishedAfterHeld: the store's grants.published_at (now() of the
	// operator's publishing transaction, the database's clock: when it
	// began) minus the moment Acquire returned; negative when the
	// publication began before the worker knew it held.
	PublishedAfterHeld dist `json:"published_at_minus_held"`
	// Operator: fencekeeper_store_publish_duration_seconds over this pass
	// (a histogram: quantiles interpolated within its buckets).
	Operator pgPublishMetric `json:"operator_publish_duration"`
	// Grants: grants held over the pass, warm-up included (the operator's
	// figures count them all).
	Grants int `json:"grants"`
}

// pgPublishMetric is what the operator's metrics say about a pass: its
// publications to the store and their duration, and the issuer's registry
// writes, lost compare-and-swaps and handoff gaps (histograms: quantiles
// interpolated within their buckets).
type pgPublishMetric struct {
	Publications float64 `json:"publications"`
	P50          float64 `json:"p50_ms"`
	P99          float64 `json:"p99_ms"`
	// RegistryWrites and CASConflicts: fencekeeper_registry_writes_total and
	// fencekeeper_fence_cas_conflicts_total over the pass.
	RegistryWrites float64 `json:"registry_writes"`
	CASConflicts   float64 `json:"cas_conflicts"`
	// HandoffGapP50: fencekeeper_grant_handoff_seconds (the previous
	// holder's end → the next grant, the issuer's clock), p50 in ms.
	HandoffGapP50 float64 `json:"handoff_gap_p50_ms"`
	Read          bool    `json:"read"`
}

// pgOneResource is P5: eight workers on one resource through the lock,
// against eight workers on one row with SELECT … FOR UPDATE.
type pgOneResource struct {
	Workers int            `json:"workers"`
	Windows []pgLockWindow `json:"windows"`
	Plain   pgLockWindow   `json:"plain"`
	Fenced  pgLockWindow   `json:"fenced"`
	// Ratio: fenced commits/s over plain (reported, not judged).
	Ratio        float64   `json:"ratio_fenced_over_plain"`
	WindowRatios []float64 `json:"repetition_ratios"`
	// Cycle: where a fenced cycle's time goes (all windows).
	AcquireWait dist `json:"fenced_acquire"`
	Read        dist `json:"fenced_read"`
	Commit      dist `json:"fenced_commit_tx"`
	Release     dist `json:"fenced_release"`
	// Operator: the publications over the fenced windows.
	Operator               pgPublishMetric `json:"operator_publish_duration"`
	PublicationsPerHandoff float64         `json:"publications_per_handoff"`
	// The no-lost-update evidence, over every commit of the pass (warm-up
	// included): what each side's row holds, the commits acknowledged to
	// the workers, the commit log (one row a commit, in commit order).
	FencedCheck  pgLostUpdate `json:"fenced_check"`
	PlainCheck   pgLostUpdate `json:"plain_check"`
	NoLostUpdate bool         `json:"no_lost_update"`
}

// pgLockWindow is one window of one kind, or a kind's windows pooled.
type pgLockWindow struct {
	Kind    string `json:"kind"`
	Rep     int    `json:"repetition"`
	Commits int    `json:"commits"`
	// Handoffs: grants held (fenced only; each commits once).
	Handoffs          int     `json:"handoffs"`
	Seconds           float64 `json:"seconds"`
	PerSecond         float64 `json:"commits_per_second"`
	HandoffsPerSecond float64 `json:"handoffs_per_second"`
	// Cycle: one worker's whole turn (fenced: acquire → read → commit →
	// release; plain: the transaction).
	Cycle dist `json:"cycle"`

	samples []time.Duration
}

// pgLostUpdate is one side's evidence.
type pgLostUpdate struct {
	Row          int64 `json:"row_value"`
	Acknowledged int64 `json:"acknowledged_commits"`
	LogRows      int64 `json:"commit_log_rows"`
	// Consecutive: the log's values, in commit order, are 1, 2, … (every
	// commit read its predecessor's value).
	Consecutive bool `json:"values_consecutive_in_commit_order"`
	// FencesIncreasing: every commit's fence is higher than the previous
	// commit's (fenced only), FirstFence and LastFence their range.
	FencesIncreasing *bool    `json:"fences_increasing_in_commit_order,omitempty"`
	FirstFence       int64    `json:"first_fence,omitempty"`
	LastFence        int64    `json:"last_fence,omitempty"`
	Errors           []string `json:"errors,omitempty"`
	OK               bool     `json:"ok"`
}

// pgLockEnv is the control plane, the operator and the lock passes' workers.
type pgLockEnv struct {
	b       *pgBench
	e       *env
	workers []*pgLockWorker
}

// pgLockWorker is a lockclient client with its own identity and its own
// connection to the store.
type pgLockWorker struct {
	c    *lockclient.Client
	pool *pgxpool.Pool
}

// lockPasses starts the control plane and the operator, runs P4 and P5 and
// stops them. What was measured is kept in res even on error.
func (b *pgBench) lockPasses(ctx context.Context, res *pgstoreResult, log io.Writer) error {
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	start := time.Now()
	fmt.Fprintln(log, "== lock: starting etcd, kube-apiserver and the operator (cmd/manager) against this PostgreSQL…")
	le, err := b.startLock(ctx, log)
	if le != nil {
		defer le.stop()
	}
	if err != nil {
		return err
	}
	res.Operator = le.e.op.Describe()
	fmt.Fprintf(log, "   ready in %.1fs\n", time.Since(start).Seconds())
	fmt.Fprintf(log, "== P4: HELD → first accepted segment, %d uncontended acquisitions and %d handoffs between two workers\n",
		b.cfg.PublishChain, b.cfg.PublishQueued)
	if res.Publication, err = le.publication(ctx, log); err != nil {
		return fmt.Errorf("publication: %w", err)
	}
	fmt.Fprintf(log, "== P5: one resource, %d workers through the lock vs one row with SELECT … FOR UPDATE, %d windows of %s of each kind\n",
		b.cfg.LockWorkers, b.cfg.LockReps, b.cfg.LockWindow)
	if res.OneResource, err = le.oneResource(ctx, log); err != nil {
		return fmt.Errorf("one resource: %w", err)
	}
	res.LockRunTime = time.Since(start).Round(time.Millisecond).String()
	fmt.Fprintf(log, "   through the lock: %s in all\n", res.LockRunTime)
	return nil
}

// startLock creates the lock passes' tables (protected under their
// resources, and the plain twins), starts the control plane and the
// operator, and creates the FencedResources naming this store.
func (b *pgBench) startLock(ctx context.Context, log io.Writer) (*pgLockEnv, error) {
	publishID, contendedID := pgLockNS+"/"+pgPublishFR, pgLockNS+"/"+pgContendedFR
	ddl := []string{
		fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, amount bigint NOT NULL)", pgPublishTable),
		fmt.Sprintf("INSERT INTO %s VALUES (1, 0)", pgPublishTable),
	}
	for _, t := range [][2]string{{pgCounterTable, pgCommitsTable}, {pgPlainCounter, pgPlainCommits}} {
		ddl = append(ddl,
			fmt.Sprintf("CREATE TABLE %s (id int PRIMARY KEY, amount bigint NOT NULL)", t[0]),
			fmt.Sprintf("INSERT INTO %s VALUES (1, 0)", t[0]),
			fmt.Sprintf("CREATE TABLE %s (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, worker int NOT NULL, fence bigint NOT NULL, value bigint NOT NULL)", t[1]))
	}
	for _, t := range []string{pgPublishTable, pgCounterTable, pgCommitsTable, pgPlainCounter, pgPlainCommits} {
		ddl = append(ddl, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s TO %s", t, pgWorkerRole))
	}
	for _, s := range ddl {
		if _, err := b.admin.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	for t, id := range map[string]string{pgPublishTable: publishID, pgCounterTable: contendedID, pgCommitsTable: contendedID} {
		if err := pgfence.Protect(ctx, b.admin, t, id); err != nil {
			return nil, err
		}
	}
	e, err := startEnv(ctx, &config{out: b.cfg.Out, maxReconciles: 4}, log)
	if err != nil {
		return nil, err
	}
	le := &pgLockEnv{b: b, e: e}
	if err := e.namespace(ctx, pgLockNS); err != nil {
		return le, err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pgLockNS, Name: pgLockSecret},
		StringData: map[string]string{"dsn": b.srv.DSN(pgDatabase) + " user=" + pgOperatorRole}}
	if err := e.admin.Create(ctx, secret); err != nil {
		return le, err
	}
	for name, id := range map[string]string{pgPublishFR: publishID, pgContendedFR: contendedID} {
		fr := &locksv1.FencedResource{ObjectMeta: metav1.ObjectMeta{Namespace: pgLockNS, Name: name},
			Spec: locksv1.FencedResourceSpec{ResourceID: id, LeaseDurationSeconds: pgLockLease, Enforcement: locksv1.EnforcementEnforce,
				Stores: []locksv1.StoreReference{{Name: "bench", SecretRef: locksv1.StoreSecretReference{Name: pgLockSecret}}}}}
		if err := e.admin.Create(ctx, fr); err != nil {
			return le, err
		}
	}
	for range max(2, b.cfg.LockWorkers) {
		c, _, err := e.worker(ctx, pgLockNS)
		if err != nil {
			return le, err
		}
		p, err := b.pool(ctx, pgWorkerRole)
		if err != nil {
			return le, err
		}
		le.workers = append(le.workers, &pgLockWorker{c: c, pool: p})
	}
	// The operator registers both resources at the store before any grant.
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM fencekeeper.resources WHERE resource_id IN ($1, $2)", publishID, contendedID).Scan(&n); err != nil {
			return le, err
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			return le, errors.New("the operator did not publish the FencedResources to the store within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return le, nil
}

func (le *pgLockEnv) stop() {
	for _, w := range le.workers {
		w.pool.Close()
	}
	if le.e != nil {
		le.e.stop()
	}
}

// publishMetric scrapes the operator's metrics ("" when it cannot).
func (le *pgLockEnv) publishMetric(ctx context.Context) string {
	text, err := le.e.op.Metrics(ctx)
	if err != nil {
		return ""
	}
	return text
}

// publishDelta is the operator's publication histogram between two scrapes.
func publishDelta(after, before string) pgPublishMetric {
	if after == "" || before == "" {
		return pgPublishMetric{}
	}
	h := histogramDelta(after, before, pgMetricPublish)
	m := pgPublishMetric{Publications: h.total(), P50: round3(h.quantile(0.5) * 1e3), P99: round3(h.quantile(0.99) * 1e3), Read: h.total() > 0}
	a, b := parseMetrics(after), parseMetrics(before)
	m.RegistryWrites = a["fencekeeper_registry_writes_total"] - b["fencekeeper_registry_writes_total"]
	m.CASConflicts = a["fencekeeper_fence_cas_conflicts_total"] - b["fencekeeper_fence_cas_conflicts_total"]
	if g := histogramDelta(after, before, "fencekeeper_grant_handoff_seconds"); g.total() > 0 {
		m.HandoffGapP50 = round3(g.quantile(0.5) * 1e3)
	}
	return m
}

// timedCommit is CommitTx of one change of row 1 of table to value, and how long it took.
func timedCommit(ctx context.Context, op *lockclient.Operation, pool *pgxpool.Pool, table string, value int64) (fence.Receipt, time.Duration, error) {
	payload, err := fence.PayloadDigest(map[string]any{"table": table, "id": 1, "amount": value})
	if err != nil {
		return fence.Receipt{}, 0, err
	}
	t0 := time.Now()
	r, err := op.CommitTx(ctx, pool, payload, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE "+table+" SET amount = $1 WHERE id = 1", value)
		return err
	})
	return r, time.Since(t0), err
}

// publication is P4. Each sample: Acquire returns (HELD), the grant's first
// CommitTx (which waits for the publication), its second CommitTx (the
// control), then the release or the handoff to the waiting worker.
func (le *pgLockEnv) publication(ctx context.Context, log io.Writer) (pgPublication, error) {
	var out pgPublication
	a, bw := le.workers[0], le.workers[1]
	var first, chain, queued, second, acquire, release []time.Duration
	type held struct {
		at     time.Time
		digest string
	}
	var helds []held
	value := int64(0)
	// sample runs the two commits of a freshly held lock.
	sample := func(w *pgLockWorker, l *lockclient.Lock, at time.Time, record bool, kind *[]time.Duration) error {
		op := l.Operation("publish-" + l.Name())
		value++
		r1, _, err := timedCommit(ctx, op, w.pool, pgPublishTable, value)
		t1 := time.Now()
		if err != nil {
			return fmt.Errorf("first commit of fence %d: %w", l.Fence(), err)
		}
		value++
		r2, d2, err := timedCommit(ctx, op, w.pool, pgPublishTable, value)
		if err != nil {
			return fmt.Errorf("second commit of fence %d: %w", l.Fence(), err)
		}
		if r1.Segment != 1 || r2.Segment != 2 || r1.Fence != l.Fence() {
			return fmt.Errorf("fence %d: receipts %+v and %+v, want segments 1 and 2 of this fence", l.Fence(), r1, r2)
		}
		if record {
			d1 := t1.Sub(at)
			first, second, *kind = append(first, d1), append(second, d2), append(*kind, d1)
			g, _ := l.Grant()
			helds = append(helds, held{at: at, digest: g.Digest()})
		}
		return nil
	}
	acquireCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Minute) }
	warm := 3
	before := le.publishMetric(ctx)
	// Uncontended: acquire → two commits → release, one worker.
	for i := range warm + le.b.cfg.PublishChain {
		actx, cancel := acquireCtx()
		t0 := time.Now()
		l, err := a.c.Acquire(actx, pgPublishFR, lockclient.AcquireOptions{})
		at := time.Now()
		cancel()
		if err != nil {
			return out, fmt.Errorf("acquire: %w", err)
		}
		if i >= warm {
			acquire = append(acquire, at.Sub(t0))
		}
		if err := sample(a, l, at, i >= warm, &chain); err != nil {
			return out, err
		}
		t2 := time.Now()
		if err := l.Release(ctx); err != nil {
			return out, fmt.Errorf("release: %w", err)
		}
		if i >= warm {
			release = append(release, time.Since(t2))
		}
	}
	// Handoffs: the holder releases once the other worker's request is
	// queued; that worker's Acquire returns on the handoff.
	actx, cancel := acquireCtx()
	cur, err := a.c.Acquire(actx, pgPublishFR, lockclient.AcquireOptions{})
	cancel()
	if err != nil {
		return out, fmt.Errorf("acquire: %w", err)
	}
	curW, nextW := a, bw // the holder, and the worker queued behind it
	for i := range warm + le.b.cfg.PublishQueued {
		reqID := fmt.Sprintf("handoff-%d", i)
		type got struct {
			l   *lockclient.Lock
			at  time.Time
			d   time.Duration
			err error
		}
		ch := make(chan got, 1)
		go func() {
			actx, cancel := acquireCtx()
			defer cancel()
			t0 := time.Now()
			l, err := nextW.c.Acquire(actx, pgPublishFR, lockclient.AcquireOptions{RequestID: reqID})
			at := time.Now()
			ch <- got{l, at, at.Sub(t0), err}
		}()
		if err := le.waitCreated(ctx, nextW.c.LockGrantName(pgPublishFR, reqID)); err != nil {
			return out, err
		}
		t2 := time.Now()
		if err := cur.Release(ctx); err != nil {
			return out, fmt.Errorf("release: %w", err)
		}
		if i >= warm {
			release = append(release, time.Since(t2))
		}
		g := <-ch
		if g.err != nil {
			return out, fmt.Errorf("acquire after a handoff: %w", g.err)
		}
		if err := sample(nextW, g.l, g.at, i >= warm, &queued); err != nil {
			return out, err
		}
		cur, curW, nextW = g.l, nextW, curW
	}
	if err := cur.Release(ctx); err != nil {
		return out, fmt.Errorf("release: %w", err)
	}
	out.Operator = publishDelta(le.publishMetric(ctx), before)
	out.Grants = 2*warm + le.b.cfg.PublishChain + le.b.cfg.PublishQueued + 1
	out.First, out.Chain, out.Queued, out.Second = summarize(first), summarize(chain), summarize(queued), summarize(second)
	out.Acquire, out.Release = summarize(acquire), summarize(release)
	out.DiffP50, out.DiffP99 = round3(out.First.P50-out.Second.P50), round3(out.First.P99-out.Second.P99)
	// When each grant's publication began at the store, against HELD.
	var offsets []time.Duration
	for _, h := range helds {
		var publishedAt time.Time
		if err := le.b.admin.QueryRow(ctx, "SELECT published_at FROM fencekeeper.grants WHERE digest = $1", h.digest).Scan(&publishedAt); err != nil {
			return out, fmt.Errorf("the published grant %s: %w", h.digest, err)
		}
		offsets = append(offsets, publishedAt.Sub(h.at))
	}
	out.PublishedAfterHeld = summarize(offsets)
	if out.First.N == 0 || out.Second.N == 0 {
		return out, errNoSamples
	}
	fmt.Fprintf(log, "   first commit p50/p99 %s/%s ms, second %s/%s ms\n", fmtF(out.First.P50), fmtF(out.First.P99), fmtF(out.Second.P50), fmtF(out.Second.P99))
	return out, nil
}

// waitCreated waits until the LockGrant name exists (the request is queued).
func (le *pgLockEnv) waitCreated(ctx context.Context, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var lg locksv1.LockGrant
		err := le.e.admin.Get(ctx, client.ObjectKey{Namespace: pgLockNS, Name: name}, &lg)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("LockGrant %s not created within 30 s: %w", name, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// lockTally is what the workers of a pass did, over all its windows.
type lockTally struct {
	mu                             sync.Mutex
	acknowledged                   int64
	errors                         []string
	acquire, read, commit, release []time.Duration
}

func (t *lockTally) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.errors) < 10 {
		t.errors = append(t.errors, err.Error())
	}
}

// oneResource is P5.
func (le *pgLockEnv) oneResource(ctx context.Context, log io.Writer) (pgOneResource, error) {
	cfg := le.b.cfg
	out := pgOneResource{Workers: cfg.LockWorkers, Plain: pgLockWindow{Kind: kindPlain}, Fenced: pgLockWindow{Kind: kindFenced}}
	var fenced, plain lockTally
	for _, f := range []bool{false, true} {
		if _, err := le.lockWindow(ctx, f, cfg.LockWarmup, &fenced, &plain, false); err != nil {
			return out, err
		}
	}
	// Plain windows touch no lock: the publications between these two
	// scrapes are the fenced windows'.
	before := le.publishMetric(ctx)
	for rep := range cfg.LockReps {
		fencedFirst := rep%2 == 1
		var perSecond [2]float64
		for _, f := range []bool{fencedFirst, !fencedFirst} {
			w, err := le.lockWindow(ctx, f, cfg.LockWindow, &fenced, &plain, true)
			if err != nil {
				return out, err
			}
			w.Rep = rep + 1
			out.Windows = append(out.Windows, w)
			pool := &out.Plain
			if f {
				pool, perSecond[1] = &out.Fenced, w.PerSecond
			} else {
				perSecond[0] = w.PerSecond
			}
			pool.merge(w)
			fmt.Fprintf(log, "   window %d/%d %s: %d commits, %s/s, cycle p50/p99 %s/%s ms\n", rep+1, cfg.LockReps, w.Kind, w.Commits,
				fmtF(w.PerSecond), fmtF(w.Cycle.P50), fmtF(w.Cycle.P99))
		}
		out.WindowRatios = append(out.WindowRatios, fineRatio(perSecond[1], perSecond[0]))
	}
	out.Operator = publishDelta(le.publishMetric(ctx), before)
	out.Plain.finish()
	out.Fenced.finish()
	out.Ratio = fineRatio(out.Fenced.PerSecond, out.Plain.PerSecond)
	out.AcquireWait, out.Read, out.Commit, out.Release = summarize(fenced.acquire), summarize(fenced.read), summarize(fenced.commit), summarize(fenced.release)
	if out.Operator.Publications > 0 && out.Fenced.Handoffs > 0 {
		out.PublicationsPerHandoff = round2(out.Operator.Publications / float64(out.Fenced.Handoffs))
	}
	var err error
	if out.FencedCheck, err = le.lostUpdate(ctx, pgCounterTable, pgCommitsTable, &fenced, true); err != nil {
		return out, err
	}
	if out.PlainCheck, err = le.lostUpdate(ctx, pgPlainCounter, pgPlainCommits, &plain, false); err != nil {
		return out, err
	}
	out.NoLostUpdate = out.FencedCheck.OK && out.PlainCheck.OK
	if out.Plain.Commits == 0 || out.Fenced.Commits == 0 {
		return out, errNoSamples
	}
	return out, nil
}

// lockWindow runs every worker's loop of one kind until d has passed, and
// lets each finish its turn. Measured windows go into the result; every
// commit goes into the tally.
func (le *pgLockEnv) lockWindow(ctx context.Context, fenced bool, d time.Duration, ft, pt *lockTally, measured bool) (pgLockWindow, error) {
	w := pgLockWindow{Kind: kindPlain}
	t := pt
	if fenced {
		w.Kind, t = kindFenced, ft
	}
	start := time.Now()
	end := start.Add(d)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, le.b.cfg.LockWorkers)
	for i := range le.b.cfg.LockWorkers {
		wk := le.workers[i]
		wg.Go(func() {
			var mine []time.Duration
			handoffs := 0
			for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
				t0 := time.Now()
				var err error
				if fenced {
					err = le.fencedTurn(ctx, i, n, wk, t, measured)
					handoffs++
				} else {
					err = plainTurn(ctx, i, wk.pool, t)
				}
				if err != nil {
					errs[i] = err
					t.fail(err)
					break
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			w.samples = append(w.samples, mine...)
			if fenced {
				w.Handoffs += handoffs
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	w.Seconds = time.Since(start).Seconds()
	w.finish()
	return w, errors.Join(errs...)
}

// fencedTurn is one worker's turn through the lock: acquire (FIFO), read
// the row outside any transaction, commit the row + 1 under the grant (and
// the commit's line in the log), release.
func (le *pgLockEnv) fencedTurn(ctx context.Context, worker, n int, wk *pgLockWorker, t *lockTally, measured bool) error {
	actx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	l, err := wk.c.Acquire(actx, pgContendedFR, lockclient.AcquireOptions{})
	if err != nil {
		return fmt.Errorf("worker %d: acquire: %w", worker, err)
	}
	t1 := time.Now()
	var v int64
	if err := wk.pool.QueryRow(ctx, "SELECT amount FROM "+pgCounterTable+" WHERE id = 1").Scan(&v); err != nil {
		l.Orphan()
		return fmt.Errorf("worker %d: read: %w", worker, err)
	}
	t2 := time.Now()
	v++
	payload, err := fence.PayloadDigest(map[string]any{"counter": 1, "amount": v})
	if err != nil {
		return err
	}
	f := l.Fence()
	r, err := l.Operation(fmt.Sprintf("count-%d-%d", worker, n)).CommitTx(ctx, wk.pool, payload, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE "+pgCounterTable+" SET amount = $1 WHERE id = 1", v); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+pgCommitsTable+" (worker, fence, value) VALUES ($1, $2, $3)", worker, f, v)
		return err
	})
	t3 := time.Now()
	if err != nil {
		_ = l.Release(ctx)
		return fmt.Errorf("worker %d: commit under fence %d: %w", worker, f, err)
	}
	if r.Fence != f {
		_ = l.Release(ctx)
		return fmt.Errorf("worker %d: receipt of fence %d under the lock's fence %d", worker, r.Fence, f)
	}
	t.mu.Lock()
	t.acknowledged++
	t.mu.Unlock()
	if err := l.Release(ctx); err != nil {
		return fmt.Errorf("worker %d: release: %w", worker, err)
	}
	if measured {
		t4 := time.Now()
		t.mu.Lock()
		t.acquire, t.read, t.commit, t.release = append(t.acquire, t1.Sub(t0)), append(t.read, t2.Sub(t1)), append(t.commit, t3.Sub(t2)), append(t.release, t4.Sub(t3))
		t.mu.Unlock()
	}
	return nil
}

// plainTurn is the control's turn: one transaction that takes the row's
// lock (SELECT … FOR UPDATE), writes the row + 1 and the commit's line.
func plainTurn(ctx context.Context, worker int, pool *pgxpool.Pool, t *lockTally) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var v int64
		if err := tx.QueryRow(ctx, "SELECT amount FROM "+pgPlainCounter+" WHERE id = 1 FOR UPDATE").Scan(&v); err != nil {
			return err
		}
		v++
		if _, err := tx.Exec(ctx, "UPDATE "+pgPlainCounter+" SET amount = $1 WHERE id = 1", v); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+pgPlainCommits+" (worker, fence, value) VALUES ($1, 0, $2)", worker, v)
		return err
	})
	if err != nil {
		return fmt.Errorf("worker %d: plain transaction: %w", worker, err)
	}
	t.mu.Lock()
	t.acknowledged++
	t.mu.Unlock()
	return nil
}

// lostUpdate reads one side's row and commit log and checks them against
// the commits the workers were told succeeded.
func (le *pgLockEnv) lostUpdate(ctx context.Context, counter, commits string, t *lockTally, fenced bool) (pgLostUpdate, error) {
	out := pgLostUpdate{Acknowledged: t.acknowledged, Errors: t.errors, Consecutive: true}
	increasing := true
	if err := le.b.admin.QueryRow(ctx, "SELECT amount FROM "+counter+" WHERE id = 1").Scan(&out.Row); err != nil {
		return out, err
	}
	rows, err := le.b.admin.Query(ctx, "SELECT fence, value FROM "+commits+" ORDER BY seq")
	if err != nil {
		return out, err
	}
	defer rows.Close()
	var prev int64
	for rows.Next() {
		var f, v int64
		if err := rows.Scan(&f, &v); err != nil {
			return out, err
		}
		out.LogRows++
		if v != out.LogRows {
			out.Consecutive = false
		}
		if fenced {
			if out.LogRows == 1 {
				out.FirstFence = f
			} else if f <= prev {
				increasing = false
			}
			prev, out.LastFence = f, f
		}
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	if fenced {
		out.FencesIncreasing = &increasing
	}
	out.OK = len(out.Errors) == 0 && out.Row == out.Acknowledged && out.LogRows == out.Acknowledged && out.Consecutive && (increasing || !fenced)
	return out, nil
}

// fineRatio is ratio with three decimals: the lock's ratio to the row
// lock can be under 0.01.
func fineRatio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return round3(a / b)
}

func (w *pgLockWindow) merge(x pgLockWindow) {
	w.samples = append(w.samples, x.samples...)
	w.Seconds += x.Seconds
	w.Handoffs += x.Handoffs
}

func (w *pgLockWindow) finish() {
	w.Commits = len(w.samples)
	w.Cycle = summarize(w.samples)
	if w.Seconds > 0 {
		w.PerSecond = round2(float64(w.Commits) / w.Seconds)
		w.HandoffsPerSecond = round2(float64(w.Handoffs) / w.Seconds)
	}
	w.Seconds = round2(w.Seconds)
}

// describe is the evidence in a line.
func (c pgLostUpdate) describe(kind string) string {
	s := fmt.Sprintf("%s: row %d, %d commits acknowledged, %d in the commit log", kind, c.Row, c.Acknowledged, c.LogRows)
	if c.Consecutive {
		s += ", values 1…n in commit order"
	} else {
		s += ", values NOT consecutive in commit order"
	}
	if c.FencesIncreasing != nil {
		if *c.FencesIncreasing {
			s += fmt.Sprintf(", fences increasing in commit order (%d → %d)", c.FirstFence, c.LastFence)
		} else {
			s += ", fences NOT increasing in commit order"
		}
	}
	if len(c.Errors) > 0 {
		s += "; errors: " + strings.Join(c.Errors, "; ")
	}
	return s
}
