package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// pgDiagnosis is where a fenced segment's time goes, beyond its round trips.
type pgDiagnosis struct {
	// Functions: the schema's functions, per segment of the diagnosis pass
	// (a session with track_functions = all).
	Segments  int          `json:"segments"`
	Functions []pgFunction `json:"functions"`
	// Plans: EXPLAIN ANALYZE of begin_segment's lookups and of the guarded
	// UPDATE, in a fenced transaction that is rolled back.
	Plans []pgPlan `json:"plans"`
	// Receipts and Grants: rows at the end of the measured passes.
	Receipts      int64   `json:"receipts_rows"`
	ReceiptsMiB   float64 `json:"receipts_mib"`
	Grants        int64   `json:"grants_rows"`
	HistoryProbe  pgProbe `json:"grant_history_probe"`
	HistoryPlanOf pgPlan  `json:"grant_lookup_plan_with_history"`
	// EnvelopeBytes: a segment's envelope as sent (and stored in
	// resources.last_envelope_digest).
	EnvelopeBytes int `json:"envelope_bytes"`
	// Flush: an 8 KiB write and fsync of a file on the data directory's
	// filesystem, what a commit waits for at the least (ms).
	Flush dist `json:"write_fsync_8kib"`
}

type pgFunction struct {
	Name string `json:"name"`
	// Calls per segment; TotalMs and SelfMs per call (self: without the
	// functions it called).
	CallsPerSegment float64 `json:"calls_per_segment"`
	TotalMs         float64 `json:"total_ms_per_call"`
	SelfMs          float64 `json:"self_ms_per_call"`
}

type pgPlan struct {
	What string `json:"what"`
	// Summary: the plan's scan, lock and trigger lines and its execution time.
	Summary string `json:"summary"`
	Plan    string `json:"plan"`
}

// pgProbe: the begin_segment round trip before and after the store holds
// a history of ended grants of other resources (grants are never deleted).
type pgProbe struct {
	EndedGrants int     `json:"ended_grants_added"`
	Segments    int     `json:"segments_each"`
	BeforeP50   float64 `json:"begin_segment_p50_ms_before"`
	AfterP50    float64 `json:"begin_segment_p50_ms_after"`
	// IndexedP50: after, with an index on grants (resource_id, fence)
	// added by the bench (not part of the schema).
	IndexedP50 float64 `json:"begin_segment_p50_ms_with_resource_fence_index"`
}

func (b *pgBench) diagnose(ctx context.Context) (pgDiagnosis, error) {
	var d pgDiagnosis
	var err error
	if d.Segments, d.Functions, err = b.functionTimes(ctx); err != nil {
		return d, fmt.Errorf("function times: %w", err)
	}
	if d.Plans, err = b.plans(ctx); err != nil {
		return d, fmt.Errorf("plans: %w", err)
	}
	err = b.admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM fencekeeper.receipts), pg_total_relation_size('fencekeeper.receipts'), (SELECT count(*) FROM fencekeeper.grants)").
		Scan(&d.Receipts, &d.ReceiptsMiB, &d.Grants)
	if err != nil {
		return d, err
	}
	d.ReceiptsMiB = round2(d.ReceiptsMiB / (1 << 20))
	r := b.resources[0]
	env, err := r.envelope(r.segment + 1)
	if err != nil {
		return d, err
	}
	d.EnvelopeBytes = len(env.Encode())
	if d.Flush, err = flushProbe(filepath.Dir(b.srv.DataDir()), 200); err != nil {
		return d, fmt.Errorf("fsync probe: %w", err)
	}
	if d.HistoryProbe, d.HistoryPlanOf, err = b.historyProbe(ctx); err != nil {
		return d, fmt.Errorf("grant history probe: %w", err)
	}
	return d, nil
}

// functionTimes runs the diagnosis segments in a session of the role that
// tracks function calls, after a warm-up in that session (its first calls
// compile the PL/pgSQL and plan its statements), and reads what the server
// counted for the measured ones.
func (b *pgBench) functionTimes(ctx context.Context) (int, []pgFunction, error) {
	pool, err := b.pool(ctx, pgDiagRole)
	if err != nil {
		return 0, nil, err
	}
	defer pool.Close()
	segments := func(n int) error {
		for range n {
			if _, _, err := b.resources[0].txn(ctx, pool, txFenced); err != nil {
				return err
			}
		}
		return nil
	}
	warm, n := max(20, b.cfg.DiagSegments/10), b.cfg.DiagSegments
	if err := segments(warm); err != nil {
		return 0, nil, err
	}
	// A session reports its counts at the end of a transaction when its
	// last report is a second old (else 10 s later), and when it ends.
	if err := ctxtime.Sleep(ctx, 1100*time.Millisecond); err != nil {
		return 0, nil, err
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
		return 0, nil, err
	}
	before, err := b.functionCounts(ctx, int64(warm))
	if err != nil {
		return 0, nil, err
	}
	if err := segments(n); err != nil {
		return 0, nil, err
	}
	pool.Close() // a session reports its counts when it ends
	after, err := b.functionCounts(ctx, int64(warm+n))
	if err != nil {
		return 0, nil, err
	}
	var out []pgFunction
	for name, a := range after {
		x := before[name]
		calls, total, self := a.calls-x.calls, a.total-x.total, a.self-x.self
		if calls <= 0 {
			continue
		}
		out = append(out, pgFunction{Name: name, CallsPerSegment: round2(float64(calls) / float64(n)),
			TotalMs: round3(total / float64(calls)), SelfMs: round3(self / float64(calls))})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].TotalMs*out[i].CallsPerSegment > out[j].TotalMs*out[j].CallsPerSegment
	})
	return n, out, nil
}

type functionCount struct {
	calls       int64
	total, self float64
}

// functionCounts reads the schema's functions' counters once begin_segment
// was counted at least atLeast times (within 10 s).
func (b *pgBench) functionCounts(ctx context.Context, atLeast int64) (map[string]functionCount, error) {
	const q = "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions WHERE schemaname = 'fencekeeper'"
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := b.admin.Query(ctx, q)
		if err != nil {
			return nil, err
		}
		out := map[string]functionCount{}
		for rows.Next() {
			var name string
			var c functionCount
			if err := rows.Scan(&name, &c.calls, &c.total, &c.self); err != nil {
				rows.Close()
				return nil, err
			}
			out[name] = c
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if out["begin_segment"].calls >= atLeast {
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("begin_segment counted %d times, want %d", out["begin_segment"].calls, atLeast)
		}
		if err := ctxtime.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// begin_segment's lookups, as its PL/pgSQL runs them ($1 the resource,
// $2 the fence, $3 the grant document).
const (
	sqlResourceLock = "SELECT * FROM fencekeeper.resources r WHERE r.resource_id = $1 FOR NO KEY UPDATE"
	sqlGrantLookup  = "SELECT * FROM fencekeeper.grants x WHERE x.resource_id = $1 AND x.fence = $2 AND x.grant_doc = $3::jsonb"
	sqlHolderLookup = "SELECT * FROM fencekeeper.grants x WHERE x.resource_id = $1 AND x.ended_at IS NULL ORDER BY x.fence DESC LIMIT 1"
	sqlGuardLookup  = "SELECT 1 FROM fencekeeper.resources r WHERE r.resource_id = $1 AND r.segment_xact = pg_current_xact_id()"
)

// plans explains begin_segment's lookups, then begins a segment and
// explains the guard's lookup and the guarded UPDATE, as the superuser, in
// a transaction rolled back at the end (the segment is not used up).
func (b *pgBench) plans(ctx context.Context) ([]pgPlan, error) {
	r := b.resources[0]
	env, err := r.envelope(r.segment + 1)
	if err != nil {
		return nil, err
	}
	doc := string(r.grant.Canonical())
	tx, err := b.admin.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var out []pgPlan
	for _, q := range []struct {
		what, sql string
		args      []any
	}{
		{"resource row lock (FOR NO KEY UPDATE)", sqlResourceLock, []any{r.id}},
		{"grant lookup (resource, fence, document)", sqlGrantLookup, []any{r.id, r.grant.FenceToken, doc}},
		{"holder lookup", sqlHolderLookup, []any{r.id}},
		{"begin_segment, its first call in a session", "SELECT fencekeeper.begin_segment($1::jsonb)", []any{env.Encode()}},
		{"guard's lookup (the resource row names the transaction)", sqlGuardLookup, []any{r.id}},
		{"guarded UPDATE (fencekeeper_guard trigger)", r.fencedSQL, []any{1}},
	} {
		p, err := explain(ctx, tx, q.what, q.sql, q.args...)
		if err != nil {
			return out, fmt.Errorf("%s: %w", q.what, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of sql in tx.
func explain(ctx context.Context, tx pgx.Tx, what, sql string, args ...any) (pgPlan, error) {
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql, args...)
	if err != nil {
		return pgPlan{}, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return pgPlan{}, err
	}
	var keep []string
	for _, l := range lines {
		t := strings.TrimLeft(strings.TrimSpace(l), "-> ")
		for _, k := range []string{"Scan", "LockRows", "Trigger", "Execution Time", "Result", "Update on", "Sort", "Limit"} {
			if strings.HasPrefix(t, k) || strings.Contains(t, " "+k+" ") {
				keep = append(keep, t)
				break
			}
		}
	}
	return pgPlan{What: what, Summary: strings.Join(keep, "; "), Plan: strings.Join(lines, "\n")}, nil
}

// historyProbe times the begin_segment round trip (fenced transactions on
// resource 0), adds a history of ended grants of other resources and hands
// resource 0 over to a grant published after them (the newest grant is
// the last in the table, as in a store that has run a while), and times it
// again; then again with an index on grants (resource_id, fence), which
// the schema does not have.
func (b *pgBench) historyProbe(ctx context.Context) (pgProbe, pgPlan, error) {
	p := pgProbe{Segments: b.cfg.DiagSegments, EndedGrants: b.cfg.HistoryGrants}
	var plan pgPlan
	r := b.resources[0]
	segmentP50 := func() (float64, error) {
		var s []time.Duration
		for i := range p.Segments + 1 {
			_, steps, err := r.txn(ctx, b.pools[0], txFenced)
			if err != nil {
				return 0, err
			}
			if i > 0 { // the first may delete the receipts of an older fence
				s = append(s, steps[0])
			}
		}
		return summarize(s).P50, nil
	}
	var err error
	if p.BeforeP50, err = segmentP50(); err != nil {
		return p, plan, err
	}
	const perResource = 10
	history := fmt.Sprintf("INSERT INTO fencekeeper.resources (resource_id) SELECT 'history/' || r FROM generate_series(1, %[1]d) r; "+
		"INSERT INTO fencekeeper.grants (digest, resource_id, fence, grant_doc, expires_at, ended_at, end_reason) "+
		"SELECT 'sha256:' || encode(sha256(convert_to(r || '/' || f, 'UTF8')), 'hex'), 'history/' || r, f, "+
		"jsonb_build_object('resource', 'history/' || r, 'fenceToken', f, 'owner', 'someone-' || f), now(), now(), 'Released' "+
		"FROM generate_series(1, %[1]d) r, generate_series(1, %[2]d) f; ANALYZE fencekeeper.grants",
		p.EndedGrants/perResource, perResource)
	if _, err := b.admin.Exec(ctx, history); err != nil {
		return p, plan, err
	}
	operator, err := b.connect(ctx, pgOperatorRole)
	if err != nil {
		return p, plan, err
	}
	err = b.issue(ctx, operator, r, r.grant.FenceToken+1)
	_ = operator.Close(ctx)
	if err != nil {
		return p, plan, err
	}
	if p.AfterP50, err = segmentP50(); err != nil {
		return p, plan, err
	}
	err = pgx.BeginFunc(ctx, b.admin, func(tx pgx.Tx) error {
		plan, err = explain(ctx, tx, fmt.Sprintf("grant lookup, the newest of %d grants", p.EndedGrants+len(b.resources)+1),
			sqlGrantLookup, r.id, r.grant.FenceToken, string(r.grant.Canonical()))
		return err
	})
	if err != nil {
		return p, plan, err
	}
	if _, err := b.admin.Exec(ctx, "CREATE INDEX bench_grants_resource_fence ON fencekeeper.grants (resource_id, fence)"); err != nil {
		return p, plan, err
	}
	p.IndexedP50, err = segmentP50()
	return p, plan, err
}

// flushProbe times n writes of 8 KiB, each followed by fsync, to a file
// in dir.
func flushProbe(dir string, n int) (dist, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return dist{}, err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	defer f.Close()
	page := make([]byte, 8192)
	samples := make([]time.Duration, 0, n)
	for i := range n {
		t := time.Now()
		if _, err := f.WriteAt(page, int64(i%16)*8192); err != nil {
			return dist{}, err
		}
		if err := f.Sync(); err != nil {
			return dist{}, err
		}
		samples = append(samples, time.Since(t))
	}
	return summarize(samples), nil
}
