package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// report is everything one run measured; it is printed as a table and
// written as JSON.
type report struct {
	Env        envInfo           `json:"environment"`
	Config     map[string]any    `json:"config"`
	Durations  map[string]string `json:"phase_durations"`
	Micro      *microResult      `json:"microbenchmarks,omitempty"`
	Handoff    *handoffResult    `json:"release_handoff,omitempty"`
	Expiry     *expiryResult     `json:"expiry_handoff,omitempty"`
	Throughput *throughputResult `json:"throughput,omitempty"`
	Webhook    *webhookResult    `json:"webhook_overhead,omitempty"`
	Scale      *scaleResult      `json:"scale,omitempty"`
	NonTarget  *nontargetResult  `json:"nontarget,omitempty"`
	Soak       *soakResult       `json:"soak,omitempty"`
	Targets    []target          `json:"targets"`
}

type envInfo struct {
	Start      time.Time `json:"start"`
	RunTime    string    `json:"run_time"`
	Command    string    `json:"command"`
	Go         string    `json:"go"`
	CPUs       int       `json:"cpus"`
	LoadBefore string    `json:"uptime_before"`
	LoadAfter  string    `json:"uptime_after"`
	Commit     string    `json:"commit"`
	Operator   string    `json:"operator"`
	Quick      bool      `json:"quick"`
}

// target is one line of the targets, judged on figures of this run: PASS
// or FAIL for a single figure, PASS, FAIL or INCONCLUSIVE for a line
// measured in repetitions (verdict.go), REPORTED for a figure shown and not
// judged.
type target struct {
	Name     string  `json:"name"`
	Rule     string  `json:"rule"`
	Measured float64 `json:"measured"`
	Limit    limit   `json:"limit"`
	Unit     string  `json:"unit"`
	Verdict  string  `json:"verdict"`
	// Repetitions: the figure of each repetition, for a line judged by the
	// tail rule (Measured is their median).
	Repetitions []float64 `json:"repetitions,omitempty"`
	Detail      string    `json:"detail"`
}

func newReport(cfg *config) *report {
	r := &report{Durations: map[string]string{}}
	r.Env = envInfo{Start: time.Now().UTC(), Command: strings.Join(os.Args, " "), Go: runtime.Version(), CPUs: runtime.NumCPU(),
		LoadBefore: uptime(), Commit: gitCommit(), Quick: cfg.quick}
	r.Config = map[string]any{
		"warmup": cfg.warmup, "handoffs": cfg.handoffs, "le_handoffs": cfg.leHandoffs, "le_retry_period": cfg.leRetry.String(),
		"expiries": cfg.expiries, "expiry_parallel": cfg.expiryPar, "throughput_duration": cfg.tputDuration.String(),
		"throughput_warmup": cfg.tputWarmup.String(), "clients": cfg.clients, "contended_resources": cfg.contendedOn, "sweep": cfg.sweep,
		"rates": cfg.rates, "webhook_samples": cfg.webhookSamples, "scale": cfg.scaleSizes, "scale_handoffs": cfg.scaleHandoffs,
		"scale_webhook_samples": cfg.scaleWebhook, "nontarget_entries": cfg.ntEntries, "nontarget_setup_budget": cfg.ntBudget.String(), "nontarget_fill": cfg.ntFill,
		"nontarget_samples": cfg.ntSamples, "nontarget_rate": cfg.ntRate, "max_concurrent_reconciles": cfg.maxReconciles, "in_process": cfg.inProcess,
	}
	return r
}

func (r *report) finish(start time.Time) {
	r.Env.RunTime = time.Since(start).Round(time.Second).String()
	r.Env.LoadAfter = uptime()
}

// judge records a line judged on one figure: PASS or FAIL.
func (r *report) judge(name, rule string, measured float64, l limit, unit, detail string) {
	v := verdictFail
	if l.within(measured) {
		v = verdictPass
	}
	r.addTarget(target{Name: name, Rule: rule, Measured: measured, Limit: l, Unit: unit, Verdict: v, Detail: detail})
}

// allPass reports whether no line FAILed (an INCONCLUSIVE one is not a
// miss, and is never printed as a PASS).
func (r *report) allPass() bool {
	if r.Soak != nil && r.Soak.Verdict == verdictFail {
		return false
	}
	for _, t := range r.Targets {
		if t.Verdict == verdictFail {
			return false
		}
	}
	return true
}

func (r *report) write(path string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	b, err := marshalFinite(r)
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// print writes the table.
func (r *report) print(out io.Writer) {
	r.Env.print(out)
	tb := newTable(out)
	if m := r.Micro; m != nil {
		m.print(tb)
	}
	if h := r.Handoff; h != nil {
		h.print(tb)
	}
	if x := r.Expiry; x != nil {
		x.print(tb)
	}
	if t := r.Throughput; t != nil {
		t.print(tb)
	}
	if w := r.Webhook; w != nil {
		w.print(tb)
	}
	if s := r.Scale; s != nil {
		s.print(tb)
	}
	if x := r.NonTarget; x != nil {
		x.print(out, tb.section, tb.row, tb.flush)
	}
	if x := r.Soak; x != nil {
		x.print(out, tb.section, tb.row, tb.flush)
	}
	printTargets(tb, r.Targets)
}

// table is the printed report: sections, each a title and rows aligned in
// columns, with notes between them.
type table struct {
	out io.Writer
	tw  *tabwriter.Writer
}

func newTable(out io.Writer) *table {
	return &table{out: out, tw: tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)}
}

// row writes one row; floats are formatted by fmtF.
func (tb *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(tb.tw, "\t")
		}
		switch v := c.(type) {
		case float64:
			fmt.Fprint(tb.tw, fmtF(v))
		default:
			fmt.Fprint(tb.tw, v)
		}
	}
	fmt.Fprintln(tb.tw, "\t")
}

// section ends the rows so far and starts a section with its title.
func (tb *table) section(title string) {
	tb.tw.Flush()
	fmt.Fprintf(tb.out, "\n%s\n", title)
}

// flush ends the rows so far, before a note.
func (tb *table) flush() { tb.tw.Flush() }

// distRow writes a distribution's row: n, p50, p90, p99, max.
func (tb *table) distRow(name string, d dist) { tb.row(name, d.N, d.P50, d.P90, d.P99, d.Max) }

// print writes the run's header: when, where, what ran.
func (e envInfo) print(out io.Writer) {
	fmt.Fprintf(out, "\nfencekeeper bench — %s, %d CPUs, %s, commit %s\n", e.Start.Format(time.RFC3339), e.CPUs, e.Go, e.Commit)
	fmt.Fprintf(out, "command: %s\nrun time: %s\nload before: %s\nload after:  %s\noperator: %s\n",
		e.Command, e.RunTime, e.LoadBefore, e.LoadAfter, e.Operator)
	if e.Quick {
		fmt.Fprintln(out, "QUICK MODE: samples far too small to judge; the figures only prove the bench runs.")
	}
}

// print writes the microbenchmarks' section.
func (m *microResult) print(tb *table) {
	tb.section("Acceptance floor (Go microbenchmarks, one core)")
	tb.row("function", "ns/op", "allocs/op", "B/op")
	for _, b := range m.Benchmarks {
		tb.row(b.Name, b.NsPerOp, b.AllocsPerOp, b.BytesPerOp)
	}
}

// print writes section 1, the release handoff, and where its time goes.
func (h *handoffResult) print(tb *table) {
	tb.section(fmt.Sprintf("1. Release handoff: holder releases → waiter HELD with fence+1 (ms), %d rotated blocks", len(h.P50OverFloor)))
	tb.row("mechanism", "n", "p50", "p90", "p99", "max")
	tb.distRow("fencekeeper (lockclient)", h.Fencekeeper)
	tb.distRow("raw Lease CAS + watch", h.Raw)
	tb.distRow("custom-resource floor: 2 writes, 2 hops*", h.Floor)
	tb.distRow("one-write floor: the release promotes a pre-signed head", h.OneWrite)
	tb.distRow(fmt.Sprintf("leaderelection ReleaseOnCancel (retry %s)", h.LERetryPeriod), h.LeaderElection)
	tb.row("fencekeeper first 10% / last 10% p99", "", "", "", fmt.Sprintf("%s / %s", fmtF(h.FirstTenthP99), fmtF(h.LastTenthP99)), "")
	tb.flush()
	fmt.Fprintf(tb.out, "  fencekeeper over the floor by block: p50 %s; p99 %s\n", repsString(h.P50OverFloor), repsString(h.P99OverFloor))
	fmt.Fprintf(tb.out, "  * release PATCH → minimal issuer (raw watch, sign, registry CAS) → waiter's registry watch, on copies of the CRDs with real-size objects, no operator (floorhandoff.go; not judged): p50 %s× raw, p99 %s× raw; fencekeeper is %s× / %s× the floor\n",
		fmtF(ratio(h.Floor.P50, h.Raw.P50)), fmtF(ratio(h.Floor.P99, h.Raw.P99)), fmtF(ratio(h.Fencekeeper.P50, h.Floor.P50)), fmtF(ratio(h.Fencekeeper.P99, h.Floor.P99)))
	tb.section("   where a fencekeeper handoff's time goes (ms after Release was called)")
	tb.row("step", "p50", "p99")
	for _, s := range h.Stages {
		tb.row(s.Name, s.P50, s.P99)
	}
	tb.row("(floor: release request answered)", h.FloorReleaseAnswered.P50, h.FloorReleaseAnswered.P99)
}

// print writes section 2, the expiry handoff, and where its time goes.
func (x *expiryResult) print(tb *table) {
	tb.section("2. Expiry handoff: expiresAt (issuer clock) → waiter HELD (ms)")
	tb.row("mechanism", "n", "p50", "p90", "p99", "max")
	tb.distRow("fencekeeper, 1 s leases", x.Fencekeeper)
	tb.section("   where an expiry handoff's time goes (ms after expiresAt)")
	tb.row("step", "p50", "p99")
	for _, s := range x.Stages {
		tb.row(s.Name, s.P50, s.P99)
	}
}

// print writes section 3, the throughput runs, with their API and CPU
// cost per cycle.
func (t *throughputResult) print(tb *table) {
	tb.section(fmt.Sprintf("3. Throughput: closed-loop acquire→release, %d clients, %d rotated repetitions of %s windows", t.Clients, t.Repetitions, t.Window))
	tb.row("run", "resources", "cycles", "cycles/s", "by repetition", "cycle p50 ms", "cycle p99 ms", "API writes/cycle", "client writes/cycle", "CAS conflicts")
	for _, x := range t.Runs {
		tb.row(x.Name, x.Resources, x.Cycles, x.PerSecond, repsString(x.PerSecondReps), x.Cycle.P50, x.Cycle.P99, x.WritesPerCycle, x.ClientWritesPerCycle, x.Conflicts)
	}
	tb.flush()
	for _, x := range t.Runs {
		if len(x.WriteBreakdown) > 0 {
			fmt.Fprintf(tb.out, "  %s — API writes/cycle by resource: %s\n", x.Name, breakdown(x.WriteBreakdown))
		}
		if len(x.ReadBreakdown) > 0 {
			fmt.Fprintf(tb.out, "  %s — API reads/cycle by resource: %s\n", x.Name, breakdown(x.ReadBreakdown))
		}
		if len(x.CPUPerCycle) > 0 {
			fmt.Fprintf(tb.out, "  %s — CPU ms/cycle by process: %s (machine %.0f%% busy)\n", x.Name, breakdown(x.CPUPerCycle), 100*x.MachineBusy)
		}
		if strings.HasPrefix(x.Name, "fencekeeper") && len(x.ReconcilesPerCycle) > 0 {
			fmt.Fprintf(tb.out, "  %s — operator reconciles/cycle by controller: %s\n", x.Name, breakdown(x.ReconcilesPerCycle))
		}
	}
	fmt.Fprintf(tb.out, "  fencekeeper over the floor, by repetition: uncontended %s; contended %s\n", repsString(t.OverFloorUncontended), repsString(t.OverFloorContended))
	fmt.Fprintf(tb.out, "  the floors over raw two-CAS: %s× uncontended, %s× contended\n", fmtF(t.FloorOverRawUncontended), fmtF(t.FloorOverRawContended))
	d := t.Deferred
	fmt.Fprintf(tb.out, "  collecting %d ended LockGrants of the contended runs (deleted as the collector deletes them, gone in %s s): %s writes each (%s); steady state %s writes per contended cycle\n",
		d.Grants, fmtF(d.Seconds), fmtF(d.PerGrant), breakdown(d.ByKind), fmtF(t.SteadyWritesPerCycle))
	if len(t.Sweep) > 0 {
		tb.section("   clients on one resource: fencekeeper's FIFO against the raw Lease herd (one window each)")
		tb.row("clients", "fencekeeper cycles/s", "raw cycles/s", "fencekeeper / raw")
		for _, p := range t.Sweep {
			tb.row(p.Clients, p.Fencekeeper, p.Raw, p.Ratio)
		}
	}
}

// print writes section 4, the webhook's overhead, and the figures that
// explain it.
func (w *webhookResult) print(tb *table) {
	tb.section("4. Webhook overhead: ConfigMap update latency, interleaved (ms)")
	tb.row("rate/s", "kind", "n", "p50", "p90", "p99", "max", "p99 ratio")
	for _, x := range w.Rates {
		tb.row(x.Rate, "unprotected", x.Unprotected.N, x.Unprotected.P50, x.Unprotected.P90, x.Unprotected.P99, x.Unprotected.Max, "")
		tb.row(x.Rate, "protected (fenced)", x.Protected.N, x.Protected.P50, x.Protected.P90, x.Protected.P99, x.Protected.Max, x.P99Ratio)
		tb.row(x.Rate, "registry GET", x.RegistryGet.N, x.RegistryGet.P50, x.RegistryGet.P90, x.RegistryGet.P99, x.RegistryGet.Max, "")
	}
	tb.flush()
	fmt.Fprintln(tb.out, "  unprotected: the twin without the protected label; in this namespace (it holds FencedResources) it still calls the webhook, which finds the entry its copied annotation names in its cache and reads nothing (that entry targets another object) — section 6 has writes the webhook never sees")
	fmt.Fprintf(tb.out, "webhook handler, protected and twin writes together (operator's fencekeeper_admission_duration_seconds): p50≈%s ms, p99≈%s ms\n", fmtF(w.Updates.HandlerP50), fmtF(w.Updates.HandlerP99))
	fmt.Fprintf(tb.out, "  of which the registry read of protected writes (fencekeeper_admission_registry_read_seconds, %.0f reads): p50≈%s ms, p99≈%s ms\n", w.Updates.Reads, fmtF(w.Updates.ReadP50), fmtF(w.Updates.ReadP99))
	fmt.Fprintf(tb.out, "webhook call (API server's apiserver_admission_webhook_admission_duration_seconds): p50≈%s ms, p99≈%s ms\n", fmtF(w.Updates.CallP50), fmtF(w.Updates.CallP99))
	fmt.Fprintf(tb.out, "  (both interpolated within coarse histogram buckets)\n")
	fmt.Fprintln(tb.out, "  registry GET: a client's GET of a pair's FencedResource (the read the webhook makes on every protected write), sent in the same open loop as the updates at half their rate")
	fmt.Fprintf(tb.out, "the same registry GET alone (quiet API server, sequential at %g/s): p50 %s ms, p99 %s ms (n=%d)\n",
		w.RegistryGetRate, fmtF(w.RegistryGetAlone.P50), fmtF(w.RegistryGetAlone.P99), w.RegistryGetAlone.N)
	if pl, wt := w.FenceStatePlain, w.FenceStateWeighted; pl.N > 0 {
		fmt.Fprintf(tb.out, "fence state alone (namespace without FencedResources, no webhook; %d updates each, interleaved at %g/s): plain p50/p99 %s/%s ms, with a protected ConfigMap's fence and receipt annotations (%d bytes, changed each write) %s/%s ms: %s/%s ms\n",
			pl.N, w.RegistryGetRate, fmtF(pl.P50), fmtF(pl.P99), w.FenceStateBytes, fmtF(wt.P50), fmtF(wt.P99), signed(wt.P50-pl.P50), signed(wt.P99-pl.P99))
		fmt.Fprintln(tb.out, "  the stored fence state is part of every protected write (the contract: the change, its fence annotation and receipt log are one write); the overhead rule's allowance, one registry GET, does not include it")
	}
}

// print writes section 5, the figures at each scale.
func (s *scaleResult) print(tb *table) {
	tb.section("5. Scale: FencedResources, with active grants up to -scale-held")
	tb.row("resources", "held", "load s", "operator RSS MiB", "peak RSS MiB", "Go heap MiB", "apiserver MiB", "etcd MiB",
		"handoff p50/p99 ms", "raw handoff p50/p99 ms", "protected p50/p99 ms", "unprotected p50/p99 ms", "acquire p50/p99 ms", "FR+target create p50 ms")
	pair := func(d dist) string { return fmtF(d.P50) + " / " + fmtF(d.P99) }
	for _, x := range s.Sizes {
		create := fmtF(x.CreateWithTarget.P50)
		if x.CreateFailures > 0 {
			create = fmt.Sprintf("%s (%d of 5 refused)", create, x.CreateFailures)
		}
		tb.row(x.Resources, x.Held, x.LoadSeconds, x.OperatorRSSMiB, x.OperatorPeakMiB, x.OperatorHeapMiB, x.APIServerRSSMiB, x.EtcdRSSMiB,
			pair(x.Handoff), pair(x.RawHandoff), pair(x.Protected), pair(x.Unprotected), pair(x.Acquire), create)
	}
	tb.flush()
	s.printStages(tb)
	for _, x := range s.Sizes {
		h := x.HandoffWrites
		fmt.Fprintf(tb.out, "handoff writes at %d, the API server's own time (apiserver_request_duration_seconds): release PATCH p50/p99 %s/%s ms, registry status PUT %s/%s ms\n",
			x.Resources, fmtF(h.ReleaseP50), fmtF(h.ReleaseP99), fmtF(h.RegistryP50), fmtF(h.RegistryP99))
	}
	for _, x := range s.Sizes {
		w := x.Webhook
		fmt.Fprintf(tb.out, "webhook at %d, UPDATEs during the protected and unprotected updates: the operator's handler p50/p99 %s/%s ms (its registry read %s/%s ms), the API server's call to it %s/%s ms (coarse buckets)\n",
			x.Resources, fmtF(w.HandlerP50), fmtF(w.HandlerP99), fmtF(w.ReadP50), fmtF(w.ReadP99), fmtF(w.CallP50), fmtF(w.CallP99))
	}
	fmt.Fprintf(tb.out, "memory: %s\n", s.MemorySource)
	for _, x := range s.Sizes {
		if x.CreateError != "" {
			fmt.Fprintf(tb.out, "FencedResource-with-target create at %d: %s\n", x.Resources, x.CreateError)
		}
	}
	if f := s.Failover; f != nil {
		fmt.Fprintf(tb.out, "failover at %d: leader killed, standby took the Lease after %.1f s; from then, first grant %.2f s, all %d requests %.2f s (%d unserved); %.0f registry writes until %.1f s; RSS standby %.0f MiB, new leader peak %.0f MiB\n",
			f.Resources, f.KillToTakeoverMs/1000, f.FirstServedMs/1000, f.Behind+f.Fresh-f.Unserved, f.AllServedMs/1000, f.Unserved,
			f.TakeoverWrites, f.SettledMs/1000, f.StandbyRSSMiB, f.LeaderPeakMiB)
	}
}

// printStages writes where the release handoff's time went at each size,
// step by step: the step whose p99 grows with the registry is where the
// scale handoff line's growth comes from.
func (s *scaleResult) printStages(tb *table) {
	if len(s.Sizes) == 0 || len(s.Sizes[0].HandoffStages) == 0 {
		return
	}
	tb.section("   where a release handoff's time goes at each size (p50 / p99, ms after Release was called)")
	head := []any{"step"}
	for _, x := range s.Sizes {
		head = append(head, x.Resources)
	}
	tb.row(head...)
	for i, st := range s.Sizes[0].HandoffStages {
		row := []any{st.Name}
		for _, x := range s.Sizes {
			cell := ""
			if i < len(x.HandoffStages) && x.HandoffStages[i].Name == st.Name {
				cell = fmtF(x.HandoffStages[i].P50) + " / " + fmtF(x.HandoffStages[i].P99)
			}
			row = append(row, cell)
		}
		tb.row(row...)
	}
	tb.flush()
}

// printTargets writes the targets and their results, then ends the table.
func printTargets(tb *table, targets []target) {
	if len(targets) == 0 {
		tb.flush()
		return
	}
	tb.section("Targets (REPORTED: shown beside them, not judged)")
	tb.row("target", "rule", "measured", "limit", "result")
	for _, t := range targets {
		lim := ""
		if t.Verdict != verdictReported {
			lim = t.Limit.String() + " " + t.Unit
		}
		tb.row(t.Name, t.Rule, fmtF(t.Measured)+" "+t.Unit, lim, t.Verdict)
	}
	tb.flush()
	for _, t := range targets {
		if t.Detail != "" {
			fmt.Fprintf(tb.out, "  %s: %s\n", t.Name, t.Detail)
		}
	}
}

func breakdown(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %s", k, fmtF(m[k])))
	}
	return strings.Join(parts, ", ")
}

// signed is fmtF of a difference, with its sign.
func signed(v float64) string {
	if v >= 0 {
		return "+" + fmtF(v)
	}
	return fmtF(v)
}

func fmtF(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "n/a"
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func uptime() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.TrimSpace(string(b))
	}
	return strings.TrimSpace(string(out))
}

func gitCommit() string {
	root, err := localcp.RepoRoot()
	if err != nil {
		return "unknown"
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if exec.Command("git", "-C", root, "diff", "--quiet", "HEAD", "--", "api", "controllers", "webhooks", "pkg", "cmd", "internal").Run() != nil {
		c += "+uncommitted changes in api/controllers/webhooks/pkg/cmd/internal"
	}
	return c
}
