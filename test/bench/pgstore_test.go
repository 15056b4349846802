package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// make bench runs TestPGStoreBench with -pgstore.full; make test runs it
// without (the quick size, seconds).
var (
	pgstoreFullFlag = flag.Bool("pgstore.full", false, "TestPGStoreBench: the full-size run (make bench), streamed to stdout, its JSON in bin/bench/pgstore.json")
	pgstoreFailFlag = flag.Bool("pgstore.fail-on-miss", false, "TestPGStoreBench: fail when a target's verdict is FAIL (default: only when the bench could not run)")
)

// TestPGStoreBench measures the PostgreSQL store against plain
// transactions on one durable server: latency, throughput and where the
// cost goes; then, through the lock on the embedded control plane with the
// operator publishing to that server, HELD → first segment and eight
// workers on one resource. Quick, it asserts no timing threshold (shared
// CI machines are noise), only that every figure and verdict was measured
// and that no update was lost.
func TestPGStoreBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	cfg := pgstoreQuick()
	cfg.Out = filepath.Join(t.TempDir(), "pgstore.json")
	var buf bytes.Buffer
	var log io.Writer = &buf
	timeout := 4 * time.Minute
	if *pgstoreFullFlag {
		root, err := localcp.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		cfg = pgstoreFull()
		cfg.Out = filepath.Join(root, "bin", "bench", "pgstore.json")
		log, timeout = os.Stdout, 15*time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	res, err := runPGStore(ctx, cfg, log)
	res.print(log)
	if werr := res.write(cfg.Out); werr != nil {
		t.Errorf("writing %s: %v", cfg.Out, werr)
	} else if *pgstoreFullFlag {
		t.Logf("JSON: %s", cfg.Out)
	}
	if !*pgstoreFullFlag {
		t.Logf("PostgreSQL store bench (quick) took %s\n%s", time.Since(start).Round(time.Millisecond), buf.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	positive := func(what string, v float64) {
		t.Helper()
		if !(v > 0) {
			t.Errorf("%s: got %v, want a measured figure", what, v)
		}
	}
	l, tp := res.Latency, res.Throughput
	positive("plain p50", l.Plain.P50)
	positive("fenced p99", l.Fenced.P99)
	for _, s := range l.Steps {
		positive(s.Name+" round trip (fenced)", s.Fenced.P50)
	}
	positive("plain commits/s", tp.Plain.PerSecond)
	positive("fenced commits/s", tp.Fenced.PerSecond)
	positive("fenced WAL bytes/commit", tp.Fenced.WALBytes)
	positive("fenced server CPU/commit", tp.Fenced.ServerCPU)
	if len(l.Reps) != cfg.Reps || len(tp.WindowRatios) != cfg.Reps {
		t.Errorf("%d latency repetitions and %d throughput repetitions, want %d each", len(l.Reps), len(tp.WindowRatios), cfg.Reps)
	}
	if len(res.Diagnosis.Functions) == 0 || res.Diagnosis.Functions[0].CallsPerSegment <= 0 {
		t.Errorf("no function times: %+v", res.Diagnosis.Functions)
	}
	p, o := res.Publication, res.OneResource
	positive("first commit after HELD p99", p.First.P99)
	positive("first commit of an uncontended acquisition p50", p.Chain.P50)
	positive("first commit of a handoff p50", p.Queued.P50)
	positive("second commit p99", p.Second.P99)
	if p.PublishedAfterHeld.N != p.First.N {
		t.Errorf("published_at read for %d of %d grants", p.PublishedAfterHeld.N, p.First.N)
	}
	positive("one resource: fenced commits/s", o.Fenced.PerSecond)
	positive("one resource: handoffs/s", o.Fenced.HandoffsPerSecond)
	positive("one resource: plain commits/s", o.Plain.PerSecond)
	positive("one resource: fenced CommitTx p50", o.Commit.P50)
	if !o.NoLostUpdate {
		t.Errorf("an update was lost: %s; %s", o.FencedCheck.describe("fenced"), o.PlainCheck.describe("plain"))
	}
	if len(res.Checks) != 4 || res.Verdict == "" {
		t.Errorf("%d targets judged (want 4: p50, p99, throughput, no lost update), verdict %q", len(res.Checks), res.Verdict)
	}
	if *pgstoreFailFlag && res.Verdict == verdictFail {
		t.Errorf("a PostgreSQL store target failed")
	}
}

func TestTailVerdict(t *testing.T) {
	for name, c := range map[string]struct {
		ratios []float64
		want   string
	}{
		"all within":                    {[]float64{1.0, 1.1, 1.05, 1.2, 0.9}, verdictPass},
		"one noisy repetition":          {[]float64{1.0, 1.1, 3.0, 1.2, 0.9}, verdictPass},
		"two noisy repetitions":         {[]float64{1.0, 1.7, 3.0, 1.2, 0.9}, verdictInconclusive},
		"median over, three far over":   {[]float64{1.4, 1.7, 3.0, 1.6, 0.9}, verdictInconclusive},
		"median over, four far over":    {[]float64{1.4, 1.7, 3.0, 1.6, 1.9}, verdictFail},
		"median over, none far over":    {[]float64{1.4, 1.4, 1.4, 1.4, 1.4}, verdictInconclusive},
		"no repetitions":                {nil, verdictInconclusive},
		"plain p99 of zero (no sample)": {[]float64{1.0, 1.0, 1.0, 1.0, math.Inf(1)}, verdictPass},
	} {
		if got, _, detail := tailVerdict(c.ratios, pgLatencyLimit, pgTailSlack); got != c.want {
			t.Errorf("%s: %s (%s), want %s", name, got, detail, c.want)
		}
	}
}
