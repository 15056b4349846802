package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
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
	positive("contract floor p50", l.Floor.P50)
	for _, s := range l.Steps {
		positive(s.Name+" round trip (fenced)", s.Fenced.P50)
	}
	positive("plain commits/s", tp.Plain.PerSecond)
	positive("fenced commits/s", tp.Fenced.PerSecond)
	positive("contract floor commits/s", tp.Floor.PerSecond)
	positive("contract floor WAL bytes/commit", tp.Floor.WALBytes)
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
	if len(res.Checks) != 7 || res.Verdict == "" {
		t.Errorf("%d targets judged (want 7: p50, p99, throughput against plain and against the contract floor, no lost update), verdict %q",
			len(res.Checks), res.Verdict)
	}
	if *pgstoreFailFlag && res.Verdict == verdictFail {
		t.Errorf("a PostgreSQL store target failed")
	}
}

// TestJudgeAgainstTheFloor: a target the contract floor alone misses is
// said to be out of reach, and the same limits judge fenced over the floor.
func TestJudgeAgainstTheFloor(t *testing.T) {
	rep := func(plain, floor, fenced float64) pgLatencyRep {
		return pgLatencyRep{Plain: dist{N: 10, P50: plain, P99: 2 * plain}, Floor: dist{N: 10, P50: floor, P99: 2 * floor},
			Fenced: dist{N: 10, P50: fenced, P99: 2 * fenced}, P99Ratio: fenced / plain, FloorP99Ratio: fenced / floor}
	}
	r := rep(0.3, 0.6, 0.66)
	res := &pgstoreResult{
		Latency: pgLatency{Plain: r.Plain, Floor: r.Floor, Fenced: r.Fenced, Reps: []pgLatencyRep{r, r, r, r, r}},
		Throughput: pgThroughput{Workers: 8, Plain: pgWindow{PerSecond: 1000}, Floor: pgWindow{PerSecond: 500}, Fenced: pgWindow{PerSecond: 450},
			FloorOverPlain: 0.5, WindowRatios: []float64{0.45}, FloorWindowRatios: []float64{0.9}},
		OneResource: pgOneResource{NoLostUpdate: true},
	}
	res.judge()
	got := map[string]pgstoreCheck{}
	for _, c := range res.Checks {
		got[c.Against+" "+c.Name] = c
	}
	for name, want := range map[string]string{
		"plain segment latency p50": verdictFail, "plain segment latency p99": verdictFail, "plain throughput, 8 workers": verdictFail,
		"contract floor segment latency p50": verdictPass, "contract floor segment latency p99": verdictPass, "contract floor throughput, 8 workers": verdictPass,
	} {
		c, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: not judged (checks %v)", name, res.Checks)
		case c.Result != want:
			t.Errorf("%s: %s (ratio %v, %s), want %s", name, c.Result, c.Ratio, c.Detail, want)
		case c.Against == kindPlain && !strings.Contains(c.Detail, "out of reach"):
			t.Errorf("%s: the floor misses the limit, the detail does not say so: %s", name, c.Detail)
		}
	}
	if res.Verdict != verdictFail {
		t.Errorf("verdict %s with targets against plain failing, want FAIL", res.Verdict)
	}
}
