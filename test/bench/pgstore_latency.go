package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// pgLatency: one connection, one row of each table, plain and fenced
// transactions alternating sample by sample.
type pgLatency struct {
	Plain  dist `json:"plain"`
	Fenced dist `json:"fenced"`
	// Reps: each interleaved repetition on its own (the tail's rule judges these).
	Reps []pgLatencyRep `json:"repetitions"`
	// Steps: each round trip of the two transactions, all repetitions pooled.
	Steps []pgStep `json:"round_trips"`
}

type pgLatencyRep struct {
	Plain    dist    `json:"plain"`
	Fenced   dist    `json:"fenced"`
	P50Ratio float64 `json:"p50_ratio"`
	P99Ratio float64 `json:"p99_ratio"`
	// BeginSegmentP50: the fenced BEGIN round trip's p50 in this
	// repetition, begin_segment included (the receipts grow by one row a segment).
	BeginSegmentP50 float64 `json:"begin_segment_p50_ms"`
	// GuardedUpdateP50: the fenced UPDATE's round trip (the guard trigger
	// looks the transaction's receipt up).
	GuardedUpdateP50 float64 `json:"guarded_update_p50_ms"`
}

// pgStep is one round trip of the transactions.
type pgStep struct {
	Name   string `json:"name"`
	Plain  dist   `json:"plain"`
	Fenced dist   `json:"fenced"`
}

// latencySamples collects one kind's samples: totals, and each round trip.
type latencySamples struct {
	total []time.Duration
	steps [3][]time.Duration
}

func (s *latencySamples) add(d time.Duration, steps [3]time.Duration) {
	s.total = append(s.total, d)
	for i, x := range steps {
		s.steps[i] = append(s.steps[i], x)
	}
}

// latency runs the interleaved repetitions on pools[0] and resource 0.
func (b *pgBench) latency(ctx context.Context, log io.Writer) (pgLatency, error) {
	var out pgLatency
	conn, r := b.pools[0], b.resources[0]
	// pair runs one plain and one fenced transaction, in the block's order.
	pair := func(i, rep int, plain, fenced *latencySamples) error {
		fencedFirst := (i/b.cfg.Block+rep)%2 == 1
		for _, f := range []bool{fencedFirst, !fencedFirst} {
			d, steps, err := r.txn(ctx, conn, f)
			if err != nil {
				return err
			}
			if f && fenced != nil {
				fenced.add(d, steps)
			} else if !f && plain != nil {
				plain.add(d, steps)
			}
		}
		return nil
	}
	for i := range b.cfg.Warmup {
		if err := pair(i, 0, nil, nil); err != nil {
			return out, err
		}
	}
	// The statistics a running store has: autovacuum analyzes the
	// receipts within its naptime (a minute); until then the planner
	// takes the table for empty (see P3).
	if _, err := b.admin.Exec(ctx, "ANALYZE"); err != nil {
		return out, err
	}
	var all [2]latencySamples
	perRep := max(1, b.cfg.Samples/b.cfg.Reps)
	for rep := range b.cfg.Reps {
		var plain, fenced latencySamples
		for i := range perRep {
			if err := pair(i, rep, &plain, &fenced); err != nil {
				return out, err
			}
		}
		x := pgLatencyRep{Plain: summarize(plain.total), Fenced: summarize(fenced.total), BeginSegmentP50: summarize(fenced.steps[0]).P50,
			GuardedUpdateP50: summarize(fenced.steps[1]).P50}
		x.P50Ratio, x.P99Ratio = ratio(x.Fenced.P50, x.Plain.P50), ratio(x.Fenced.P99, x.Plain.P99)
		out.Reps = append(out.Reps, x)
		fmt.Fprintf(log, "   repetition %d/%d: p50/p99 plain %s/%s ms, fenced %s/%s ms (%s×/%s×)\n", rep+1, b.cfg.Reps,
			fmtF(x.Plain.P50), fmtF(x.Plain.P99), fmtF(x.Fenced.P50), fmtF(x.Fenced.P99), fmtF(x.P50Ratio), fmtF(x.P99Ratio))
		for k, s := range []*latencySamples{&plain, &fenced} {
			all[k].total = append(all[k].total, s.total...)
			for j := range s.steps {
				all[k].steps[j] = append(all[k].steps[j], s.steps[j]...)
			}
		}
	}
	out.Plain, out.Fenced = summarize(all[0].total), summarize(all[1].total)
	if out.Plain.N == 0 || out.Fenced.N == 0 {
		return out, errNoSamples
	}
	for j, name := range stepNames {
		out.Steps = append(out.Steps, pgStep{Name: name, Plain: summarize(all[0].steps[j]), Fenced: summarize(all[1].steps[j])})
	}
	return out, nil
}
