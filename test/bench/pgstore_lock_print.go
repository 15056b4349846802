package main

import (
	"fmt"
	"strings"
	"time"
)

func (p pgPublication) print(tb *table) {
	if p.First.N == 0 {
		return
	}
	tb.section("P4. HELD → first accepted segment: Acquire returned → the grant's first CommitTx returned (it waits until the operator published the grant), and the same grant's second CommitTx (ms)")
	tb.row("commit", "n", "p50", "p90", "p99", "max")
	tb.distRow("first CommitTx of a grant, every handoff", p.First)
	tb.distRow("   of an uncontended acquisition", p.Chain)
	tb.distRow("   of a handoff to a queued worker", p.Queued)
	tb.distRow("second CommitTx of the same grant (control)", p.Second)
	tb.distRow("Acquire (uncontended)", p.Acquire)
	tb.distRow("Release", p.Release)
	tb.distRow("store's grants.published_at − Acquire returned", p.PublishedAfterHeld)
	tb.flush()
	fmt.Fprintf(tb.out, "  first − second: p50 %s ms, p99 %s ms (the first also reads fencekeeper.published and resource_state before its segment; the second sends at once)\n",
		signed(p.DiffP50), signed(p.DiffP99))
	if p.Operator.Read {
		fmt.Fprintf(tb.out, "  operator: %s publications for %d grants, fencekeeper_store_publish_duration_seconds p50 %s ms, p99 %s ms (histogram buckets, interpolated); issuer: %s lost compare-and-swaps\n",
			fmtF(p.Operator.Publications), p.Grants, fmtF3(p.Operator.P50), fmtF3(p.Operator.P99), fmtF(p.Operator.CASConflicts))
	}
	fmt.Fprintln(tb.out, "  published_at is now() of the operator's publishing transaction (when it began, the database's clock); negative: it began before Acquire returned")
}

func floats3(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmtF3(x)
	}
	return strings.Join(parts, ", ")
}

func (o pgOneResource) print(tb *table, window time.Duration) {
	if o.Workers == 0 || len(o.Windows) == 0 {
		return
	}
	tb.section(fmt.Sprintf("P5. One resource, %d workers: acquire (FIFO) → read the row → CommitTx the row + 1 → release; control: %d workers on one row, SELECT … FOR UPDATE; %s windows alternating",
		o.Workers, o.Workers, window))
	tb.row("window", "kind", "commits", "handoffs", "s", "commits/s", "handoffs/s", "cycle p50 ms", "cycle p99 ms")
	w := func(name string, x pgLockWindow) {
		tb.row(name, x.Kind, x.Commits, x.Handoffs, x.Seconds, x.PerSecond, x.HandoffsPerSecond, x.Cycle.P50, x.Cycle.P99)
	}
	for _, x := range o.Windows {
		w(fmt.Sprint(x.Rep), x)
	}
	w("all", o.Plain)
	w("all", o.Fenced)
	tb.section("   where a fenced turn's time goes (ms)")
	tb.row("step", "n", "p50", "p90", "p99", "max")
	tb.distRow("Acquire (queued behind the others)", o.AcquireWait)
	tb.distRow("read the row", o.Read)
	tb.distRow("CommitTx (waits for the publication)", o.Commit)
	tb.distRow("Release", o.Release)
	tb.flush()
	fmt.Fprintf(tb.out, "  fenced/plain: %s× commits/s (repetitions: %s); not judged: each handoff of the lock goes through the API server and the operator, the control's through one row lock\n",
		fmtF3(o.Ratio), floats3(o.WindowRatios))
	if m := o.Operator; m.Read {
		h := float64(o.Fenced.Handoffs)
		fmt.Fprintf(tb.out, "  operator: %s publications (%s per handoff), fencekeeper_store_publish_duration_seconds p50 %s ms, p99 %s ms; issuer: %s registry writes and %s lost compare-and-swaps per handoff, handoff gap p50 %s ms (interpolated in its buckets)\n",
			fmtF(m.Publications), fmtF(o.PublicationsPerHandoff), fmtF3(m.P50), fmtF3(m.P99), fmtF(round2(m.RegistryWrites/h)), fmtF(round2(m.CASConflicts/h)), fmtF3(m.HandoffGapP50))
	}
	fmt.Fprintf(tb.out, "  %s\n  %s\n", o.FencedCheck.describe("fenced"), o.PlainCheck.describe("plain"))
}
