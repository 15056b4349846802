package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// print writes the PostgreSQL store's sections and targets.
func (res *pgstoreResult) print(out io.Writer) {
	s := res.Server
	fmt.Fprintf(out, "\nfencekeeper bench, PostgreSQL store — %s, %d CPUs, run time %s\n", res.Start.Format(time.RFC3339), s.CPUs, res.RunTime)
	fmt.Fprintf(out, "server: %s; data directory on %s\n", s.Version, s.Filesystem)
	settings := make([]string, 0, len(pgserverSettings))
	for _, k := range pgserverSettings {
		settings = append(settings, k+"="+s.Settings[k])
	}
	fmt.Fprintf(out, "settings (initdb's defaults, none changed): %s\n", strings.Join(settings, " "))
	fmt.Fprintf(out, "load before: %s\nload after:  %s\n", s.LoadBefore, s.LoadAfter)
	if res.Config.Quick {
		fmt.Fprintln(out, "QUICK MODE: samples far too small to judge; the figures only prove the bench runs.")
	}
	tb := newTable(out)
	res.Latency.print(tb)
	res.Throughput.print(tb, res.Window)
	res.Diagnosis.print(tb)
	if res.Operator != "" {
		fmt.Fprintf(tb.out, "\nthrough the lock: the operator %s, commit %s\n", res.Operator, res.Commit)
	}
	res.Publication.print(tb)
	res.OneResource.print(tb, res.Config.LockWindow)
	tb.section("PostgreSQL store targets (fenced segment vs a plain transaction and vs the contract floor, same server, same run)")
	tb.row("target", "against", "rule", "control", "fenced", "ratio", "limit", "result")
	for _, c := range res.Checks {
		limit, r := fmtF(c.Limit)+"×", fmtF(c.Ratio)+"×"
		if c.Limit == 0 {
			limit, r = "not judged", fmtF3(c.Ratio)+"×"
		}
		tb.row(c.Name, c.Against, c.Rule, fmtF(c.Control)+" "+c.Unit, fmtF(c.Measured)+" "+c.Unit, r, limit, c.Result)
	}
	tb.flush()
	for _, c := range res.Checks {
		if c.Detail != "" {
			fmt.Fprintf(out, "  %s, against %s: %s\n", c.Name, c.Against, c.Detail)
		}
	}
	fmt.Fprintf(out, "PGSTORE VERDICT: %s\n", res.Verdict)
}

func (l pgLatency) print(tb *table) {
	tb.section("P1. Segment latency: one connection, row 1 of a 1,000-row table, plain, contract floor and fenced in turn (ms)")
	tb.row("transaction", "n", "p50", "p90", "p99", "max")
	tb.distRow("plain: BEGIN; UPDATE; COMMIT", l.Plain)
	tb.distRow("contract floor: BEGIN + fence state and receipt written; UPDATE; COMMIT", l.Floor)
	tb.distRow("fenced: BEGIN + begin_segment; UPDATE; COMMIT", l.Fenced)
	tb.section("   interleaved repetitions")
	tb.row("repetition", "n", "plain p50", "floor p50", "fenced p50", "p50 ratio", "over floor", "plain p99", "floor p99", "fenced p99", "p99 ratio", "over floor",
		"BEGIN + begin_segment p50", "guarded UPDATE p50")
	for i, r := range l.Reps {
		tb.row(i+1, r.Fenced.N, r.Plain.P50, r.Floor.P50, r.Fenced.P50, r.P50Ratio, r.FloorP50Ratio, r.Plain.P99, r.Floor.P99, r.Fenced.P99, r.P99Ratio, r.FloorP99Ratio,
			r.BeginSegmentP50, r.GuardedUpdateP50)
	}
	tb.section("   where a fenced segment's time goes: each round trip, as the client saw it (ms)")
	tb.row("round trip", "plain p50", "floor p50", "fenced p50", "fenced − plain p50", "fenced − floor p50", "plain p99", "floor p99", "fenced p99")
	for _, s := range l.Steps {
		tb.row(s.Name, s.Plain.P50, s.Floor.P50, s.Fenced.P50, signed(round3(s.Fenced.P50-s.Plain.P50)), signed(round3(s.Fenced.P50-s.Floor.P50)),
			s.Plain.P99, s.Floor.P99, s.Fenced.P99)
	}
	tb.row("whole transaction", l.Plain.P50, l.Floor.P50, l.Fenced.P50, signed(round3(l.Fenced.P50-l.Plain.P50)), signed(round3(l.Fenced.P50-l.Floor.P50)),
		l.Plain.P99, l.Floor.P99, l.Fenced.P99)
	tb.flush()
	fmt.Fprintln(tb.out, "  BEGIN: fenced sends begin_segment_enforced in the same message, the floor its two writes; UPDATE: fenced runs the fencekeeper_guard trigger (a lookup of the resource row); COMMIT: fenced runs the deferred recheck_at_commit trigger; both flush more WAL than plain")
}

func (t pgThroughput) print(tb *table, window string) {
	tb.section(fmt.Sprintf("P2. Throughput: %d closed-loop workers, each its own connection, resource, grant and row; %s windows rotating", t.Workers, window))
	tb.row("window", "kind", "commits", "s", "commits/s", "p50 ms", "p99 ms", "server CPU ms/commit", "client CPU ms/commit", "WAL bytes/commit", "machine busy %")
	w := func(name string, x pgWindow) {
		tb.row(name, x.Kind, x.Commits, x.Seconds, x.PerSecond, x.Latency.P50, x.Latency.P99, x.ServerCPU, x.ClientCPU, x.WALBytes, 100*x.MachineBusy)
	}
	for _, x := range t.Windows {
		w(fmt.Sprint(x.Rep), x)
	}
	w("all", t.Plain)
	w("all", t.Floor)
	w("all", t.Fenced)
	tb.flush()
	fmt.Fprintf(tb.out, "  fenced/plain: %s× commits/s, %s× server CPU per commit, %s× WAL bytes per commit\n",
		fmtF(t.Ratio), fmtF(ratio(t.Fenced.ServerCPU, t.Plain.ServerCPU)), fmtF(ratio(t.Fenced.WALBytes, t.Plain.WALBytes)))
	fmt.Fprintf(tb.out, "  contract floor/plain: %s× commits/s, %s× server CPU per commit, %s× WAL bytes per commit\n",
		fmtF(t.FloorOverPlain), fmtF(ratio(t.Floor.ServerCPU, t.Plain.ServerCPU)), fmtF(ratio(t.Floor.WALBytes, t.Plain.WALBytes)))
	fmt.Fprintf(tb.out, "  fenced/contract floor: %s× commits/s, %s× server CPU per commit, %s× WAL bytes per commit\n",
		fmtF(t.FloorRatio), fmtF(ratio(t.Fenced.ServerCPU, t.Floor.ServerCPU)), fmtF(ratio(t.Fenced.WALBytes, t.Floor.WALBytes)))
}

func (d pgDiagnosis) print(tb *table) {
	tb.section(fmt.Sprintf("P3. The schema's functions, server-side, over %d fenced segments (track_functions = all in that session only)", d.Segments))
	tb.row("function", "calls/segment", "total ms/call", "self ms/call")
	for _, f := range d.Functions {
		tb.row(f.Name, f.CallsPerSegment, fmtF3(f.TotalMs), fmtF3(f.SelfMs))
	}
	tb.flush()
	fmt.Fprintln(tb.out, "plans (EXPLAIN ANALYZE as the superuser, in a fenced transaction rolled back; the JSON has them whole):")
	for _, p := range d.Plans {
		fmt.Fprintf(tb.out, "  %s: %s\n", p.What, p.Summary)
	}
	fmt.Fprintf(tb.out, "receipts at the end: %d rows, %s MiB (one per accepted segment, kept while the fence is the highest); grants: %d rows\n",
		d.Receipts, fmtF(d.ReceiptsMiB), d.Grants)
	fmt.Fprintf(tb.out, "a segment's envelope: %d bytes (sent with begin_segment; its digest is stored in resources.last_envelope_digest at every segment)\n", d.EnvelopeBytes)
	fmt.Fprintf(tb.out, "8 KiB write + fsync on the data directory's filesystem: p50 %s ms, p99 %s ms (n=%d): the least a durable commit waits here\n",
		fmtF3(d.Flush.P50), fmtF3(d.Flush.P99), d.Flush.N)
	h := d.HistoryProbe
	fmt.Fprintf(tb.out, "grant history: BEGIN + begin_segment round trip p50 %s ms → %s ms once %d ended grants of other resources precede the current one → %s ms with an index on grants (resource_id, fence) (%d segments each)\n",
		fmtF3(h.BeforeP50), fmtF3(h.AfterP50), h.EndedGrants, fmtF3(h.IndexedP50), h.Segments)
	fmt.Fprintf(tb.out, "  %s: %s\n", d.HistoryPlanOf.What, d.HistoryPlanOf.Summary)
}

// fmtF3 shows sub-millisecond figures with three decimals.
func fmtF3(v float64) string {
	if v < 1 && v > -1 {
		return fmt.Sprintf("%.3f", v)
	}
	return fmtF(v)
}
