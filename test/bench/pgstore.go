package main

// The PostgreSQL store's bench: what a fenced segment (BEGIN;
// fencekeeper.begin_segment; the change; COMMIT) costs against the same
// change in a plain transaction, on one durable PostgreSQL (fsync on, as
// initdb configures it) in the same run. Latency samples alternate plain and
// fenced one by one on the same connection (the order flips each block), in
// interleaved repetitions; throughput windows of N workers alternate too.
// Where the cost goes is printed beside the targets: each round trip of
// both transactions, WAL bytes and server CPU per commit, the schema's
// functions' time per call, and the plans of begin_segment's lookups.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// pgstoreConfig sizes a run of the PostgreSQL store's bench.
type pgstoreConfig struct {
	Quick bool `json:"quick"`
	// Samples: latency samples of each kind over all repetitions.
	Samples int `json:"latency_samples_per_kind"`
	// Reps: interleaved repetitions, of the latency samples and of the
	// throughput windows alike.
	Reps int `json:"repetitions"`
	// Block: consecutive plain/fenced pairs with the same order; the order
	// flips at every block (and the first block's order at every repetition).
	Block int `json:"block_pairs"`
	// Warmup: plain/fenced pairs run, not recorded, before the first repetition.
	Warmup int `json:"warmup_pairs"`
	// Workers: throughput workers, each with its own connection, resource,
	// grant, business table and row.
	Workers int `json:"workers"`
	// Window: each throughput window; WindowWarmup: unmeasured load of
	// each kind before the first.
	Window       time.Duration `json:"-"`
	WindowWarmup time.Duration `json:"-"`
	// DiagSegments: segments the diagnosis pass runs with function tracking.
	DiagSegments int `json:"diagnosis_segments"`
	// HistoryGrants: ended grants of other resources the history probe adds.
	HistoryGrants int `json:"history_grants"`
	// PublishChain and PublishQueued: P4's samples of HELD → first
	// segment, from uncontended acquisitions and from handoffs between two
	// workers.
	PublishChain  int `json:"publication_uncontended_samples"`
	PublishQueued int `json:"publication_handoff_samples"`
	// LockWorkers: P5's workers on one resource (and on one plain row);
	// LockReps windows of LockWindow of each kind, after LockWarmup of each.
	LockWorkers int           `json:"one_resource_workers"`
	LockReps    int           `json:"one_resource_repetitions"`
	LockWindow  time.Duration `json:"-"`
	LockWarmup  time.Duration `json:"-"`
	// Out: where the JSON goes ("" nowhere).
	Out string `json:"-"`
}

// pgstoreFull is make bench's size: 2,500 samples of each kind in 5
// repetitions, 5 windows of 2 s of each kind; through the lock, 400
// handoffs and 3 windows of 5 s of each kind.
func pgstoreFull() pgstoreConfig {
	return pgstoreConfig{Samples: 2500, Reps: 5, Block: 10, Warmup: 200, Workers: 8,
		Window: 2 * time.Second, WindowWarmup: time.Second, DiagSegments: 500, HistoryGrants: 50000,
		PublishChain: 200, PublishQueued: 200, LockWorkers: 8, LockReps: 3, LockWindow: 5 * time.Second, LockWarmup: time.Second}
}

// pgstoreQuick is make test's size: the same shape, seconds in all.
func pgstoreQuick() pgstoreConfig {
	return pgstoreConfig{Quick: true, Samples: 200, Reps: 5, Block: 10, Warmup: 20, Workers: 8,
		Window: 300 * time.Millisecond, WindowWarmup: 150 * time.Millisecond, DiagSegments: 50, HistoryGrants: 5000,
		PublishChain: 10, PublishQueued: 10, LockWorkers: 8, LockReps: 1, LockWindow: 1500 * time.Millisecond, LockWarmup: 300 * time.Millisecond}
}

// The targets and the repetition rule for tails.
const (
	// pgLatencyLimit: fenced p50 (and p99, by the repetition rule) ≤ this × plain.
	pgLatencyLimit = 1.3
	// pgThroughputFloor: fenced commits/s ≥ this × plain.
	pgThroughputFloor = 0.7
)

// The database roles (cluster-wide; the server is this run's own).
const (
	pgOperatorRole = "fk_bench_operator"
	pgWorkerRole   = "fk_bench_worker"
	// pgDiagRole is a worker whose sessions track function calls
	// (track_functions = all), for the diagnosis pass only.
	pgDiagRole = "fk_bench_diag"
	pgDatabase = "pgstore"
	// pgRows: rows of each business table; every transaction updates row 1.
	pgRows = 1000
)

// pgserverSettings are the server settings the bench shows (the server
// runs with initdb's defaults: nothing is set on its command line).
var pgserverSettings = []string{"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "wal_level",
	"commit_delay", "shared_buffers", "max_wal_size", "checkpoint_timeout", "max_connections"}

// pgstoreResult is what a run measured, printed as sections and written as JSON.
type pgstoreResult struct {
	Start      time.Time     `json:"start"`
	RunTime    string        `json:"run_time"`
	Config     pgstoreConfig `json:"config"`
	Window     string        `json:"throughput_window"`
	Server     pgServerInfo  `json:"server"`
	Latency    pgLatency     `json:"latency"`
	Throughput pgThroughput  `json:"throughput"`
	Diagnosis  pgDiagnosis   `json:"diagnosis"`
	// Operator: how the lock passes ran the operator; Commit: the build;
	// LockRunTime: the lock passes' share of RunTime, start-up included.
	Operator    string         `json:"operator"`
	Commit      string         `json:"commit"`
	LockRunTime string         `json:"lock_run_time"`
	Publication pgPublication  `json:"publication"`
	OneResource pgOneResource  `json:"one_resource"`
	Checks      []pgstoreCheck `json:"checks"`
	Verdict     string         `json:"verdict"`
}

type pgServerInfo struct {
	Version    string            `json:"version"`
	Settings   map[string]string `json:"settings"`
	Filesystem string            `json:"data_directory_filesystem"`
	CPUs       int               `json:"cpus"`
	LoadBefore string            `json:"uptime_before"`
	LoadAfter  string            `json:"uptime_after"`
}

// pgstoreCheck is one target: the plain control, the fenced figure, their
// ratio and the verdict.
type pgstoreCheck struct {
	Name string `json:"name"`
	Rule string `json:"rule"`
	// Against: what Control measured (plain, contract floor).
	Against  string  `json:"against"`
	Control  float64 `json:"control"`
	Measured float64 `json:"fenced"`
	Unit     string  `json:"unit"`
	Ratio    float64 `json:"ratio"`
	Limit    float64 `json:"limit"`
	Result   string  `json:"result"`
	Detail   string  `json:"detail,omitempty"`
}

// pgResource is one resource of the store: its protected table, the plain
// twin of that table, its grant, and the last segment it was sent.
type pgResource struct {
	id      string
	grant   grant.Grant
	proof   string
	segment int64
	// floorSegment: the contract floor's last segment of r.
	floorSegment int64
	// fencedSQL and plainSQL update row 1 of the protected table and of its twin.
	fencedSQL, plainSQL string
}

// envelope is the segment seg of r's grant, its payload the change's digest.
func (r *pgResource) envelope(seg int64) (fence.Envelope, error) {
	payload, err := fence.PayloadDigest(map[string]any{"resource": r.id, "invoice": 1, "add": 1, "segment": seg})
	if err != nil {
		return fence.Envelope{}, err
	}
	return fence.Envelope{Grant: r.grant, Proof: r.proof, Operation: "bench-" + r.grant.Owner, Segment: seg, Payload: payload}, nil
}

// pgBench is the run's server, database and resources.
type pgBench struct {
	cfg   pgstoreConfig
	srv   *pgserver.Server
	admin *pgx.Conn
	// pools: each worker's pool of one connection; pools[0] also runs the
	// latency samples. Plain and fenced transactions both go through them.
	pools     []*pgxpool.Pool
	resources []*pgResource
	signer    *grant.Signer
}

// runPGStore starts a PostgreSQL, installs the schema, runs the latency,
// throughput and diagnosis passes and judges the targets. The result holds
// what was measured even when err is not nil.
func runPGStore(ctx context.Context, cfg pgstoreConfig, log io.Writer) (*pgstoreResult, error) {
	res := &pgstoreResult{Start: time.Now().UTC(), Config: cfg, Window: cfg.Window.String(), Commit: gitCommit(),
		Server: pgServerInfo{CPUs: runtime.NumCPU(), LoadBefore: uptime()}}
	start := time.Now()
	defer func() {
		res.RunTime = time.Since(start).Round(time.Millisecond).String()
		res.Server.LoadAfter = uptime()
	}()
	fmt.Fprintln(log, "Starting PostgreSQL (durable: fsync on) and installing the fencekeeper schema…")
	b, err := startPGBench(ctx, cfg)
	if b != nil {
		defer b.close()
	}
	if err != nil {
		return res, err
	}
	if res.Server, err = b.serverInfo(ctx, res.Server); err != nil {
		return res, err
	}
	fmt.Fprintf(log, "Ready in %.1fs: %s\n", time.Since(start).Seconds(), res.Server.Version)
	fmt.Fprintf(log, "== latency: %d plain and %d fenced transactions, alternating, %d repetitions\n", cfg.Samples, cfg.Samples, cfg.Reps)
	if res.Latency, err = b.latency(ctx, log); err != nil {
		return res, fmt.Errorf("latency: %w", err)
	}
	fmt.Fprintf(log, "== throughput: %d workers, %d windows of %s of each kind, alternating\n", cfg.Workers, cfg.Reps, cfg.Window)
	if res.Throughput, err = b.throughput(ctx, log); err != nil {
		return res, fmt.Errorf("throughput: %w", err)
	}
	fmt.Fprintln(log, "== diagnosis: the schema's functions per call, plans of begin_segment's lookups")
	if res.Diagnosis, err = b.diagnose(ctx); err != nil {
		return res, fmt.Errorf("diagnosis: %w", err)
	}
	if err := b.lockPasses(ctx, res, log); err != nil {
		return res, fmt.Errorf("through the lock: %w", err)
	}
	res.judge()
	return res, nil
}

// startPGBench starts the server and sets up the database: the roles, the
// schema, one protected table per resource and its plain twin, and each
// resource's grant published by the operator's role.
func startPGBench(ctx context.Context, cfg pgstoreConfig) (*pgBench, error) {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(startCtx, pgserver.Options{})
	if err != nil {
		return nil, fmt.Errorf("starting PostgreSQL (make postgres installs it): %w", err)
	}
	b := &pgBench{cfg: cfg, srv: srv}
	roles := fmt.Sprintf("CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN; CREATE ROLE %s LOGIN; ALTER ROLE %s SET track_functions = 'all'",
		pgOperatorRole, pgWorkerRole, pgDiagRole, pgDiagRole)
	if err := srv.Exec(ctx, "postgres", roles); err != nil {
		return b, err
	}
	if err := srv.CreateDatabase(ctx, pgDatabase); err != nil {
		return b, err
	}
	if b.admin, err = pgx.Connect(ctx, srv.DSN(pgDatabase)); err != nil {
		return b, err
	}
	if err := pgfence.Install(ctx, b.admin, pgfence.InstallOptions{OperatorRole: pgOperatorRole, WorkerRoles: []string{pgWorkerRole, pgDiagRole}}); err != nil {
		return b, err
	}
	floor := fmt.Sprintf("CREATE SCHEMA %[1]s; "+
		"CREATE TABLE %[1]s.resources (LIKE fencekeeper.resources INCLUDING ALL); "+
		"CREATE TABLE %[1]s.receipts (LIKE fencekeeper.receipts INCLUDING ALL); "+
		"GRANT USAGE ON SCHEMA %[1]s TO %[2]s, %[3]s; GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA %[1]s TO %[2]s, %[3]s",
		floorSchema, pgWorkerRole, pgDiagRole)
	if _, err := b.admin.Exec(ctx, floor); err != nil {
		return b, fmt.Errorf("contract floor tables: %w", err)
	}
	if err := b.setupResources(ctx); err != nil {
		return b, err
	}
	for range cfg.Workers {
		p, err := b.pool(ctx, pgWorkerRole)
		if err != nil {
			return b, err
		}
		b.pools = append(b.pools, p)
	}
	return b, nil
}

// pool is a pool of one connection of role.
func (b *pgBench) pool(ctx context.Context, role string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.srv.DSN(pgDatabase) + " user=" + role)
	if err != nil {
		return nil, err
	}
	cfg.MinConns, cfg.MaxConns = 1, 1
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (b *pgBench) connect(ctx context.Context, role string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, b.srv.DSN(pgDatabase)+" user="+role)
}

func (b *pgBench) setupResources(ctx context.Context) error {
	var err error
	if b.signer, err = grant.NewSigner("bench", []byte(strings.Repeat("k", 32))); err != nil {
		return err
	}
	operator, err := b.connect(ctx, pgOperatorRole)
	if err != nil {
		return err
	}
	defer func() { _ = operator.Close(context.WithoutCancel(ctx)) }()
	for i := range b.cfg.Workers {
		r := &pgResource{id: fmt.Sprintf("bench/invoices-%d", i)}
		table, twin := fmt.Sprintf("invoices_%d", i), fmt.Sprintf("plain_invoices_%d", i)
		for _, t := range []string{table, twin} {
			ddl := fmt.Sprintf("CREATE TABLE %[1]s (id int PRIMARY KEY, amount bigint NOT NULL); "+
				"INSERT INTO %[1]s SELECT g, 0 FROM generate_series(1, %[2]d) g; "+
				"GRANT SELECT, UPDATE ON %[1]s TO %[3]s, %[4]s", t, pgRows, pgWorkerRole, pgDiagRole)
			if _, err := b.admin.Exec(ctx, ddl); err != nil {
				return err
			}
		}
		if err := pgfence.Protect(ctx, b.admin, table, r.id); err != nil {
			return err
		}
		r.fencedSQL = "UPDATE " + table + " SET amount = amount + 1 WHERE id = $1"
		r.plainSQL = "UPDATE " + twin + " SET amount = amount + 1 WHERE id = $1"
		if err := pgfence.PublishResource(ctx, operator, r.id, pgfence.Enforce, 1); err != nil {
			return err
		}
		if err := b.issue(ctx, operator, r, 1); err != nil {
			return err
		}
		// The contract floor's resource row: its fence state is this grant's.
		if _, err := b.admin.Exec(ctx, "INSERT INTO "+floorSchema+".resources (resource_id, highest_fence, root, grant_digest) VALUES ($1, $2, $3, $4)",
			r.id, r.grant.FenceToken, r.grant.OperationRoot, r.grant.Digest()); err != nil {
			return err
		}
		b.resources = append(b.resources, r)
	}
	return nil
}

// issue makes a grant with fence f r's current one: it signs it, and the
// operator ends r's previous grant and publishes this one.
func (b *pgBench) issue(ctx context.Context, operator *pgx.Conn, r *pgResource, f int64) error {
	now := time.Now().UTC()
	if r.grant.FenceToken != 0 {
		if err := pgfence.EndGrant(ctx, operator, r.grant.Digest(), "Released", now); err != nil {
			return err
		}
	}
	owner := fmt.Sprintf("worker-%s-%d", strings.TrimPrefix(r.id, "bench/invoices-"), f)
	g := grant.Grant{Schema: grant.Schema, Resource: r.id, Owner: owner, RequestID: "req-" + owner, Lease: "lease-" + owner,
		OperationRoot: "sha256:" + strings.Repeat(fmt.Sprintf("%x", f%16), 64), FenceToken: f, BackendRevision: strconv.FormatInt(f, 10),
		PolicyGeneration: 1, IssuerEpoch: 1, TTLSeconds: 3600, IssuedAt: now.Format(time.RFC3339)}
	_, proof, err := b.signer.Sign(g)
	if err != nil {
		return err
	}
	if err := pgfence.PublishGrant(ctx, operator, g, now.Add(6*time.Hour)); err != nil {
		return err
	}
	r.grant, r.proof, r.segment = g, proof, 0
	return nil
}

func (b *pgBench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range b.pools {
		p.Close()
	}
	if b.admin != nil {
		_ = b.admin.Close(ctx)
	}
	_ = b.srv.Stop()
}

// serverInfo reads the server's version and the settings the bench shows,
// and the data directory's filesystem (fsync on tmpfs would prove nothing).
func (b *pgBench) serverInfo(ctx context.Context, info pgServerInfo) (pgServerInfo, error) {
	if err := b.admin.QueryRow(ctx, "SELECT version()").Scan(&info.Version); err != nil {
		return info, err
	}
	info.Settings = map[string]string{}
	for _, s := range pgserverSettings {
		var v string
		if err := b.admin.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v); err != nil {
			return info, err
		}
		info.Settings[s] = v
	}
	info.Filesystem = "unknown"
	if out, err := exec.CommandContext(ctx, "stat", "-f", "-c", "%T", b.srv.DataDir()).Output(); err == nil {
		info.Filesystem = strings.TrimSpace(string(out))
	}
	return info, nil
}

// stepNames are the round trips of a transaction, in order: a fenced one
// sends BEGIN and begin_segment as one message (pgfence.Commit), the
// contract floor BEGIN and its two writes.
var stepNames = [3]string{"BEGIN (fenced: + begin_segment; floor: + its writes)", "UPDATE", "COMMIT"}

// txKind is one of the transactions the bench compares.
type txKind int

const (
	// txPlain: BEGIN; the UPDATE of an unprotected table; COMMIT.
	txPlain txKind = iota
	// txFloor, the contract floor: the plain transaction plus the writes
	// the contract makes every segment pay, with no check at all: the
	// envelope received, the resource's fence state rewritten under its row
	// lock and one receipt row inserted, into tables shaped like the
	// schema's own (same columns, defaults and indexes), in the same round
	// trips as a fenced segment. No implementation of the contract writes
	// less, so a fenced/plain target below floor/plain is out of reach.
	txFloor
	// txFenced: a segment as the library commits it (pgfence.Commit).
	txFenced
	txKinds = 3
)

func (k txKind) String() string { return [txKinds]string{kindPlain, kindFloor, kindFenced}[k] }

// rotated is the kinds in turn, starting at the k-th.
func rotated(k int) [txKinds]txKind {
	var out [txKinds]txKind
	for i := range out {
		out[i] = txKind((k + i) % txKinds)
	}
	return out
}

// txn runs one transaction of kind through pool: the fenced one as the
// library commits a segment (pgfence.Commit: BEGIN and begin_segment of r's
// next segment in one message; UPDATE; COMMIT), the contract floor (BEGIN
// and its writes in one message; UPDATE; COMMIT) or the plain one (BEGIN;
// UPDATE; COMMIT), and returns how long it took and each round trip.
func (r *pgResource) txn(ctx context.Context, pool *pgxpool.Pool, kind txKind) (time.Duration, [3]time.Duration, error) {
	var steps [3]time.Duration
	t0 := time.Now()
	var t1, t2 time.Time
	update := func(tx pgx.Tx, sql string) error {
		t1 = time.Now()
		_, err := tx.Exec(ctx, sql, 1)
		t2 = time.Now()
		return err
	}
	switch kind {
	case txFenced:
		env, err := r.envelope(r.segment + 1)
		if err != nil {
			return 0, steps, err
		}
		if _, err := pgfence.Commit(ctx, pool, env, func(tx pgx.Tx) error { return update(tx, r.fencedSQL) }); err != nil {
			return 0, steps, fmt.Errorf("segment %d of %s: %w", env.Segment, r.id, err)
		}
		r.segment++
	case txFloor:
		env, err := r.envelope(r.floorSegment + 1)
		if err != nil {
			return 0, steps, err
		}
		opts := pgx.TxOptions{BeginQuery: "BEGIN; " + floorWrites(env)}
		if err := pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error { return update(tx, r.plainSQL) }); err != nil {
			return 0, steps, fmt.Errorf("contract floor, segment %d of %s: %w", env.Segment, r.id, err)
		}
		r.floorSegment++
	default:
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return update(tx, r.plainSQL) }); err != nil {
			return 0, steps, err
		}
	}
	t3 := time.Now()
	steps = [3]time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)}
	return t3.Sub(t0), steps, nil
}

// floorSchema holds the contract floor's copies of the schema's fence
// state and receipts tables.
const floorSchema = "contract_floor"

// floorWrites is the contract floor's statement for env: the envelope
// parsed, the resource's fence state rewritten (the row's lock with it) and
// the segment's receipt inserted, as begin_segment writes them, the
// receipt computed by the client.
func floorWrites(env fence.Envelope) string {
	g := env.Grant
	receipt := fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, env.Operation, env.Payload)
	return fmt.Sprintf("WITH e AS (SELECT %[1]s::jsonb AS doc), "+
		"u AS (UPDATE %[2]s.resources r SET highest_fence = %[3]d, root = %[4]s, last_segment = %[5]d, grant_digest = %[6]s, "+
		"last_envelope_digest = sha256(convert_to((SELECT doc FROM e)::text, 'UTF8')), segment_xact = pg_current_xact_id() "+
		"WHERE r.resource_id = %[7]s RETURNING r.resource_id) "+
		"INSERT INTO %[2]s.receipts (resource_id, fence, segment, operation, payload, receipt, committed_at) "+
		"SELECT resource_id, %[3]d, %[5]d, %[8]s, %[9]s, %[10]s, clock_timestamp() FROM u",
		sqlLiteral(env.Encode()), floorSchema, g.FenceToken, sqlLiteral(g.OperationRoot), env.Segment, sqlLiteral(g.Digest()),
		sqlLiteral(g.Resource), sqlLiteral(env.Operation), sqlLiteral(env.Payload), sqlLiteral(receipt))
}

// sqlLiteral is s as an SQL string literal (standard_conforming_strings on).
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// judge sets the checks and the verdict. The targets against the plain
// transaction come first; each carries what the contract floor alone costs
// against plain, measured in the same run. The same limits judged against
// the floor say what the checks and the library cost beyond the writes no
// implementation of the contract can avoid.
func (res *pgstoreResult) judge() {
	l, t := res.Latency, res.Throughput
	floorP99 := make([]float64, len(l.Reps))
	plainP99 := make([]float64, len(l.Reps))
	for i, r := range l.Reps {
		plainP99[i], floorP99[i] = r.P99Ratio, ratio(r.Floor.P99, r.Plain.P99)
	}
	_, floorP99Median, _ := pgTailVerdict(floorP99)
	reach := func(floorRatio float64, within bool) string {
		s := fmt.Sprintf("; the contract floor alone: %s× plain", fmtF(floorRatio))
		if !within {
			s += ", over the limit: out of reach for any implementation of the contract here"
		}
		return s
	}
	latencyChecks := func(against string, control, measured dist, repP99 []float64) (pgstoreCheck, pgstoreCheck) {
		p50 := pgstoreCheck{Name: "segment latency p50", Against: against, Rule: fmt.Sprintf("fenced p50 ≤ %g× %s p50 (pooled)", pgLatencyLimit, against),
			Control: control.P50, Measured: measured.P50, Unit: "ms", Ratio: ratio(measured.P50, control.P50), Limit: pgLatencyLimit,
			Detail: fmt.Sprintf("%d samples of each kind in %d interleaved repetitions", measured.N, len(l.Reps))}
		p50.Result = atMost(pgLatencyLimit).verdict(p50.Ratio)
		p99 := pgstoreCheck{Name: "segment latency p99", Against: against, Control: control.P99, Measured: measured.P99, Unit: "ms", Limit: pgLatencyLimit,
			Rule: fmt.Sprintf("median of the repetitions' p99 ratios over %s ≤ %g×, ≤ 1 over %g×", against, pgLatencyLimit, round2(tailTolerance*pgLatencyLimit))}
		p99.Result, p99.Ratio, p99.Detail = pgTailVerdict(repP99)
		p99.Detail += fmt.Sprintf("; pooled p99 ratio %s×", fmtF(ratio(measured.P99, control.P99)))
		return p50, p99
	}
	throughputCheck := func(against string, control, measured pgWindow, windowRatios []float64) pgstoreCheck {
		tp := pgstoreCheck{Name: fmt.Sprintf("throughput, %d workers", t.Workers), Against: against,
			Rule:    fmt.Sprintf("fenced commits/s ≥ %g× %s (pooled windows)", pgThroughputFloor, against),
			Control: control.PerSecond, Measured: measured.PerSecond, Unit: "commits/s", Ratio: ratio(measured.PerSecond, control.PerSecond), Limit: pgThroughputFloor,
			Detail: fmt.Sprintf("%d windows of %s of each kind; window ratios %s", len(windowRatios), res.Window, floats(windowRatios)), Result: verdictFail}
		if !math.IsNaN(tp.Ratio) && !math.IsInf(tp.Ratio, 0) && tp.Ratio >= pgThroughputFloor {
			tp.Result = verdictPass
		}
		return tp
	}
	p50, p99 := latencyChecks(kindPlain, l.Plain, l.Fenced, plainP99)
	floorP50 := ratio(l.Floor.P50, l.Plain.P50)
	p50.Detail += reach(floorP50, floorP50 <= pgLatencyLimit)
	p99.Detail += reach(floorP99Median, floorP99Median <= pgLatencyLimit) + " (median of the repetitions)"
	tp := throughputCheck(kindPlain, t.Plain, t.Fenced, t.WindowRatios)
	tp.Detail += reach(t.FloorOverPlain, t.FloorOverPlain >= pgThroughputFloor)
	overFloorP99 := make([]float64, len(l.Reps))
	for i, r := range l.Reps {
		overFloorP99[i] = r.FloorP99Ratio
	}
	fp50, fp99 := latencyChecks(kindFloor, l.Floor, l.Fenced, overFloorP99)
	ftp := throughputCheck(kindFloor, t.Floor, t.Fenced, t.FloorWindowRatios)
	o := res.OneResource
	lost := pgstoreCheck{Name: fmt.Sprintf("no lost update, %d workers on one resource", o.Workers), Against: kindPlain,
		Rule:    "row = acknowledged commits, fences increase in commit order; plain: SELECT … FOR UPDATE (ratio reported, not judged)",
		Control: o.Plain.PerSecond, Measured: o.Fenced.PerSecond, Unit: "commits/s", Ratio: o.Ratio, Result: verdictFail,
		Detail: o.FencedCheck.describe("fenced") + "; " + o.PlainCheck.describe("plain") +
			fmt.Sprintf("; %s handoffs/s; the ratio is not judged: every handoff of the lock goes through the API server and the operator", fmtF(o.Fenced.HandoffsPerSecond))}
	if o.NoLostUpdate {
		lost.Result = verdictPass
	}
	res.Checks = []pgstoreCheck{p50, p99, tp, fp50, fp99, ftp, lost}
	res.Verdict = verdictPass
	for i, c := range res.Checks {
		if math.IsNaN(c.Ratio) || math.IsInf(c.Ratio, 0) {
			res.Checks[i].Ratio = -1 // JSON has no NaN or infinity; the result says FAIL
			res.Checks[i].Result, c.Result = verdictFail, verdictFail
		}
		switch {
		case c.Result == verdictFail:
			res.Verdict = verdictFail
		case c.Result == verdictInconclusive && res.Verdict == verdictPass:
			res.Verdict = verdictInconclusive
		}
	}
}

// pgTailVerdict judges the repetitions' p99 ratios by the tail rule
// (verdict.go) against pgLatencyLimit, with a detail naming them.
func pgTailVerdict(ratios []float64) (string, float64, string) {
	l := atMost(pgLatencyLimit)
	med, v := tailVerdict(ratios, l)
	over := 0
	for _, r := range ratios {
		if l.beyond(r, tailTolerance) {
			over++
		}
	}
	detail := fmt.Sprintf("repetitions' p99 ratios %s, median %s×, %d of %d over %s×", floats(ratios), fmtF(med), over, len(ratios), fmtF(round2(tailTolerance*pgLatencyLimit)))
	return v, med, detail
}

func floats(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmtF(x)
	}
	return strings.Join(parts, ", ")
}

func (res *pgstoreResult) write(path string) error {
	if path == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	raw, err := marshalFinite(res)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// errNoSamples: a pass measured nothing (a window too short for a commit).
var errNoSamples = errors.New("no samples")
