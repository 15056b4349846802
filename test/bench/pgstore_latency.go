package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// pgLatency: one connection, one row of each table, plain, contract-floor
// and fenced transactions in turn, sample by sample.
type pgLatency struct {
	Plain  dist `json:"plain"`
	Floor  dist `json:"contract_floor"`
	Fenced dist `json:"fenced"`
	// Reps: each interleaved repetition on its own (the tail's rule judges these).
	Reps []pgLatencyRep `json:"repetitions"`
	// Steps: each round trip of the transactions, all repetitions pooled.
	Steps []pgStep `json:"round_trips"`
}

type pgLatencyRep struct {
	Plain  dist `json:"plain"`
	Floor  dist `json:"contract_floor"`
	Fenced dist `json:"fenced"`
	// P50Ratio, P99Ratio: fenced over plain; FloorP50Ratio, FloorP99Ratio:
	// fenced over the contract floor.
	P50Ratio      float64 `json:"p50_ratio"`
	P99Ratio      float64 `json:"p99_ratio"`
	FloorP50Ratio float64 `json:"p50_ratio_over_floor"`
	FloorP99Ratio float64 `json:"p99_ratio_over_floor"`
	// BeginSegmentP50: the fenced BEGIN round trip's p50 in this
	// repetition, begin_segment included (the receipts grow by one row a segment).
	BeginSegmentP50 float64 `json:"begin_segment_p50_ms"`
	// GuardedUpdateP50: the fenced UPDATE's round trip (the guard trigger
	// looks the resource row up).
	GuardedUpdateP50 float64 `json:"guarded_update_p50_ms"`
}

// pgStep is one round trip of the transactions.
type pgStep struct {
	Name   string `json:"name"`
	Plain  dist   `json:"plain"`
	Floor  dist   `json:"contract_floor"`
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

func (s *latencySamples) merge(x *latencySamples) {
	s.total = append(s.total, x.total...)
	for j := range x.steps {
		s.steps[j] = append(s.steps[j], x.steps[j]...)
	}
}

// latency runs the interleaved repetitions on pools[0] and resource 0.
func (b *pgBench) latency(ctx context.Context, log io.Writer) (pgLatency, error) {
	var out pgLatency
	conn, r := b.pools[0], b.resources[0]
	// turn runs one transaction of each kind, in the block's order (which
	// rotates at every block, and the first block's at every repetition).
	turn := func(i, rep int, into *[txKinds]latencySamples) error {
		for _, k := range rotated((i/b.cfg.Block + rep) % txKinds) {
			d, steps, err := r.txn(ctx, conn, k)
			if err != nil {
				return err
			}
			if into != nil {
				into[k].add(d, steps)
			}
		}
		return nil
	}
	for i := range b.cfg.Warmup {
		if err := turn(i, 0, nil); err != nil {
			return out, err
		}
	}
	// The statistics a running store has: autovacuum analyzes the
	// receipts within its naptime (a minute); until then the planner
	// takes the table for empty (see P3).
	if _, err := b.admin.Exec(ctx, "ANALYZE"); err != nil {
		return out, err
	}
	var all [txKinds]latencySamples
	perRep := max(1, b.cfg.Samples/b.cfg.Reps)
	for rep := range b.cfg.Reps {
		var s [txKinds]latencySamples
		for i := range perRep {
			if err := turn(i, rep, &s); err != nil {
				return out, err
			}
		}
		plain, floor, fenced := &s[txPlain], &s[txFloor], &s[txFenced]
		x := pgLatencyRep{Plain: summarize(plain.total), Floor: summarize(floor.total), Fenced: summarize(fenced.total),
			BeginSegmentP50: summarize(fenced.steps[0]).P50, GuardedUpdateP50: summarize(fenced.steps[1]).P50}
		x.P50Ratio, x.P99Ratio = ratio(x.Fenced.P50, x.Plain.P50), ratio(x.Fenced.P99, x.Plain.P99)
		x.FloorP50Ratio, x.FloorP99Ratio = ratio(x.Fenced.P50, x.Floor.P50), ratio(x.Fenced.P99, x.Floor.P99)
		out.Reps = append(out.Reps, x)
		fmt.Fprintf(log, "   repetition %d/%d: p50/p99 plain %s/%s ms, floor %s/%s ms, fenced %s/%s ms (over plain %s×/%s×, over floor %s×/%s×)\n",
			rep+1, b.cfg.Reps, fmtF(x.Plain.P50), fmtF(x.Plain.P99), fmtF(x.Floor.P50), fmtF(x.Floor.P99), fmtF(x.Fenced.P50), fmtF(x.Fenced.P99),
			fmtF(x.P50Ratio), fmtF(x.P99Ratio), fmtF(x.FloorP50Ratio), fmtF(x.FloorP99Ratio))
		for k := range s {
			all[k].merge(&s[k])
		}
	}
	out.Plain, out.Floor, out.Fenced = summarize(all[txPlain].total), summarize(all[txFloor].total), summarize(all[txFenced].total)
	if out.Plain.N == 0 || out.Floor.N == 0 || out.Fenced.N == 0 {
		return out, errNoSamples
	}
	for j, name := range stepNames {
		out.Steps = append(out.Steps, pgStep{Name: name, Plain: summarize(all[txPlain].steps[j]),
			Floor: summarize(all[txFloor].steps[j]), Fenced: summarize(all[txFenced].steps[j])})
	}
	return out, nil
}
