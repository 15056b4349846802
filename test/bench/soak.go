package main

// The hostile-tenant soak (`make soak`, `go run ./test/bench -only soak`):
// honest workers hand one lock around and write under it the whole time,
// while one tenant attacks the operator with every input the contract says
// must be refused at admission or served (docs/contract.md, "Hostile
// input"). Quiet windows (the tenant sends nothing) alternate with hostile
// windows, so the honest figures are judged against a floor measured beside
// them in the same run. See docs/performance.md, "Hostile-tenant soak".

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

const soakPhase = "soak"

type soakConfig struct {
	// duration is the hostile time in total, split into windows.
	duration    time.Duration
	windows     int
	bigGrants   int
	collectWait time.Duration
	settle      time.Duration
	// attacks the tenant makes (nil: all).
	attacks map[string]bool
	// reportTiming prints the timing checks without judging them.
	reportTiming bool
	// heapProfiles, when set, is a directory where the operator's heap
	// profile is written at the end of every window.
	heapProfiles string
}

// The tenant's attacks, by -soak-attacks name.
const (
	attackBig       = "big"        // big-annotation grants queued in its namespace
	attackBigHonest = "big-honest" // big-annotation grants on the honest lock
	attackRecords   = "records"    // garbage unresolved-mutation records
	attackChurn     = "churn"      // FencedResource churn with missing targets
	attackSquat     = "squat"      // the honest workers' next requestIDs
	attackOdd       = "odd"        // odd fields and encodings
	attackReplica   = "replica"    // the workers' identity from another pod
)

var allAttacks = []string{attackBig, attackBigHonest, attackRecords, attackChurn, attackSquat, attackOdd, attackReplica}

func (c *soakConfig) runs(attack string) bool { return c.attacks == nil || c.attacks[attack] }

// attackList parses -soak-attacks.
type attackList struct{ c *soakConfig }

func (a attackList) String() string {
	if a.c == nil || a.c.attacks == nil {
		return "all"
	}
	return strings.Join(slices.Sorted(maps.Keys(a.c.attacks)), ",")
}

func (a attackList) Set(v string) error {
	if v == "all" {
		a.c.attacks = nil
		return nil
	}
	a.c.attacks = map[string]bool{}
	for _, name := range strings.Split(v, ",") {
		if name = strings.TrimSpace(name); !slices.Contains(allAttacks, name) {
			return fmt.Errorf("unknown attack %q (known: %s)", name, strings.Join(allAttacks, ","))
		}
		a.c.attacks[name] = true
	}
	return nil
}

func (c *soakConfig) register(fs *flag.FlagSet) {
	fs.Var(attackList{c}, "soak-attacks", "Soak: the tenant's attacks, comma-separated ("+strings.Join(allAttacks, ",")+"), or all (to find which input does the harm).")
	fs.DurationVar(&c.duration, "soak-duration", 5*time.Minute, "Soak (-only soak): hostile time in total, split into -soak-windows windows; a quiet window half as long comes before the first, a pause as long after each, and a quiet one after cleanup.")
	fs.IntVar(&c.windows, "soak-windows", 5, "Soak: number of hostile windows.")
	fs.BoolVar(&c.reportTiming, "soak-report-timing", false, "Soak: print the timing checks (handoff p99, issuing rate, honest wait) as REPORTED instead of judging them (TestQuickSoak: a short run on a shared machine has too few samples; make soak judges them).")
	fs.IntVar(&c.bigGrants, "soak-big-grants", 1000, "Soak: LockGrants carrying the largest annotation admission allows, queued in the tenant's namespace during the hostile windows.")
	fs.DurationVar(&c.collectWait, "soak-collect-wait", 13*time.Minute, "Soak: how long to wait after cleanup for the operator's target-claim collector (a pass every 10 min; claims older than 2 min). When its pass is due later, the claim check says INCONCLUSIVE.")
	fs.StringVar(&c.heapProfiles, "soak-heap-profiles", "", "Soak: a directory where the operator's heap profile is written at the end of every window (<n>-<kind>.pb.gz; read with go tool pprof): what holds its memory.")
	fs.DurationVar(&c.settle, "soak-settle", 30*time.Second, "Soak: how long operator RSS is sampled after cleanup, with no traffic, before the leftover check (it goes on during the collector wait).")
}

// soakRun is one soak: the honest side, the tenant, and what both record.
type soakRun struct {
	e   *env
	cfg soakConfig
	log io.Writer
	res *soakResult

	honest *honestSide
	tenant *tenantSide
	// hostile is open during the hostile windows: the tenant's drivers act
	// only then.
	hostile gate
	rec     *soakRecorder
}

// gate is open or closed; drivers wait while it is closed.
type gate struct{ open atomic.Bool }

// wait returns once the gate is open, or ctx's error.
func (g *gate) wait(ctx context.Context) error {
	for !g.open.Load() {
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// paced runs f every interval while g is open, until ctx ends.
func paced(ctx context.Context, g *gate, interval time.Duration, f func(ctx context.Context)) {
	for g.wait(ctx) == nil {
		next := time.Now().Add(interval)
		f(ctx)
		if ctxtime.Sleep(ctx, time.Until(next)) != nil {
			return
		}
	}
}

func (r *report) soak(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	if cfg.soak.windows < 1 || cfg.soak.duration <= 0 {
		return fmt.Errorf("-soak-windows must be ≥ 1 and -soak-duration > 0")
	}
	s := &soakRun{e: e, cfg: cfg.soak, log: log, rec: newSoakRecorder()}
	s.res = &soakResult{HostileTime: cfg.soak.duration.String(), WindowsAsked: cfg.soak.windows, Attacks: attackList{&cfg.soak}.String()}
	r.Soak = s.res
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var err error
	if s.honest, err = s.setupHonest(ctx); err != nil {
		return fmt.Errorf("honest side: %w", err)
	}
	if s.tenant, err = s.setupTenant(ctx); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	s.res.Tenant, s.res.HonestIdentity = s.tenant.user, s.honest.identity
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); s.sampleMemory(ctx) }()
	go func() { defer bg.Done(); s.sampleClaims(ctx) }()
	honestCtx, stopHonest := context.WithCancel(ctx)
	honestDone := s.honest.run(honestCtx, s.rec)
	floorDone := s.startFloor(honestCtx)
	err = s.timeline(ctx)
	if err == nil {
		err = s.cleanup(ctx)
	}
	if err == nil {
		err = s.window(ctx, windowAfterCleanup, s.quietLen())
	}
	stopHonest()
	<-honestDone
	<-floorDone
	if err != nil {
		return err
	}
	_ = s.window(ctx, windowSettle, s.cfg.settle) // its only error is ctx's, checked next
	if err := ctx.Err(); err != nil {
		return err
	}
	s.checkLeases(ctx)
	cancel()
	bg.Wait()
	s.res.analyze(s.rec, s.tenant)
	if s.cfg.reportTiming {
		s.res.reportTiming()
	}
	fmt.Fprintf(log, "   soak verdict: %s\n", s.res.Verdict)
	return nil
}

func (s *soakRun) hostileLen() time.Duration { return s.cfg.duration / time.Duration(s.cfg.windows) }
func (s *soakRun) quietLen() time.Duration   { return s.hostileLen() / 2 }

// timeline runs a warm-up, a quiet window (the baseline before the tenant
// sent anything), then hostile windows each followed by a pause (the tenant
// sends nothing, what it created stays). The tenant's drivers act only
// while the gate is open.
func (s *soakRun) timeline(ctx context.Context) error {
	if err := s.window(ctx, windowWarmup, 3*time.Second); err != nil {
		return err
	}
	drivers := s.tenant.start(ctx, s)
	defer drivers.wait()
	for i := 0; i < s.cfg.windows; i++ {
		kind := windowPause
		if i == 0 {
			kind = windowQuiet
		}
		if err := s.window(ctx, kind, s.quietLen()); err != nil {
			return err
		}
		s.hostile.open.Store(true)
		err := s.window(ctx, windowHostile, s.hostileLen())
		s.hostile.open.Store(false)
		if err != nil {
			return err
		}
	}
	drivers.stop()
	return s.window(ctx, windowPause, s.quietLen())
}

// window records a window of kind lasting d.
func (s *soakRun) window(ctx context.Context, kind string, d time.Duration) error {
	before := s.scrape(ctx)
	w := soakWindow{Kind: kind, Start: time.Now()}
	cpu := sampleCPU()
	fmt.Fprintf(s.log, "   %s window (%s)\n", kind, d)
	err := ctxtime.Sleep(ctx, d)
	w.Where = where(before, s.scrape(context.WithoutCancel(ctx)))
	s.endWindow(w, cpu)
	return err
}

// endWindow records w as ended now, with the CPU each process used since before.
func (s *soakRun) endWindow(w soakWindow, before cpuSample) {
	w.End = time.Now()
	after := sampleCPU()
	secs := w.End.Sub(w.Start).Seconds()
	w.CPUPercent = map[string]float64{}
	for k, v := range after.byProcess {
		w.CPUPercent[k] = round2((v - before.byProcess[k]) * 100 / secs)
	}
	if all := after.machineAll - before.machineAll; all > 0 {
		w.MachineBusy = round2((after.machineBusy - before.machineBusy) / all)
	}
	s.res.Windows = append(s.res.Windows, w)
	s.saveHeapProfile(len(s.res.Windows), w.Kind)
}

// saveHeapProfile writes the operator's heap profile when -soak-heap-profiles asks.
func (s *soakRun) saveHeapProfile(n int, kind string) {
	if s.cfg.heapProfiles == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := s.e.op.HeapProfile(ctx)
	if err == nil {
		err = os.MkdirAll(s.cfg.heapProfiles, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(s.cfg.heapProfiles, fmt.Sprintf("%02d-%s.pb.gz", n, kind)), p, 0o644)
	}
	if err != nil {
		fmt.Fprintf(s.log, "   heap profile after window %d: %v\n", n, err)
	}
	if text, err := s.e.op.Metrics(ctx); err == nil {
		m := parseMetrics(text)
		fmt.Fprintf(s.log, "   operator after window %d: goroutines %.0f, heap in use %.1f MiB, idle %.1f MiB (released %.1f), stacks %.1f MiB, next GC %.1f MiB, sys %.1f MiB\n", n,
			m["go_goroutines"], m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_heap_idle_bytes"]/(1<<20), m["go_memstats_heap_released_bytes"]/(1<<20),
			m["go_memstats_stack_inuse_bytes"]/(1<<20), m["go_memstats_next_gc_bytes"]/(1<<20), m["go_memstats_sys_bytes"]/(1<<20))
	}
}

// cleanup deletes everything the tenant created and waits until the
// operator let the LockGrants go; it is a window of its own (not judged).
func (s *soakRun) cleanup(ctx context.Context) error {
	before := s.scrape(ctx)
	w := soakWindow{Kind: windowCleanup, Start: time.Now()}
	cpu := sampleCPU()
	fmt.Fprintf(s.log, "   cleanup: deleting what the tenant created\n")
	err := s.tenant.cleanup(ctx, s.e)
	w.Where = where(before, s.scrape(context.WithoutCancel(ctx)))
	s.endWindow(w, cpu)
	s.res.CleanupSeconds = round2(time.Since(w.Start).Seconds())
	return err
}

// sampleMemory reads the operator's RSS twice a second until ctx ends.
func (s *soakRun) sampleMemory(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if m, err := s.e.op.Resident(); err == nil {
			s.rec.rss(time.Now(), m)
		}
		select {
		case <-ctx.Done():
			c := childRSS()
			s.res.Memory.APIServerEndMiB, s.res.Memory.EtcdEndMiB = mib(c["kube-apiserver"]), mib(c["etcd"])
			return
		case <-t.C:
		}
	}
}
