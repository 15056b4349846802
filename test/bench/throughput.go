package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

type throughputResult struct {
	Clients     int    `json:"clients"`
	Window      string `json:"window"`
	Repetitions int    `json:"repetitions"`
	// Runs: raw two-CAS, fencekeeper, the custom-resource floor and the
	// floor with the status phase, uncontended then contended, each pooled
	// over its repetitions.
	Runs []tputRun `json:"runs"`
	// ContendedRatio is fencekeeper's contended cycles/s over the raw baseline's.
	ContendedRatio   float64 `json:"contended_ratio_fencekeeper_over_raw"`
	UncontendedRatio float64 `json:"uncontended_ratio_fencekeeper_over_raw"`
	// OverFloor*: fencekeeper's cycles/s over the floor's, repetition by
	// repetition (each pair measured in the same rotation).
	OverFloorUncontended []float64 `json:"fencekeeper_over_floor_uncontended_by_repetition"`
	OverFloorContended   []float64 `json:"fencekeeper_over_floor_contended_by_repetition"`
	// PhaseFloorOver*: the floor with the contract's status phase
	// (floorphase.go) over the plain floor, and fencekeeper over it, by
	// repetition: the first is the most the line above can reach under the
	// contract, the second what fencekeeper does beyond that.
	PhaseFloorOverFloorUncontended       []float64 `json:"phase_floor_over_floor_uncontended_by_repetition"`
	PhaseFloorOverFloorContended         []float64 `json:"phase_floor_over_floor_contended_by_repetition"`
	FencekeeperOverPhaseFloorUncontended []float64 `json:"fencekeeper_over_phase_floor_uncontended_by_repetition"`
	FencekeeperOverPhaseFloorContended   []float64 `json:"fencekeeper_over_phase_floor_contended_by_repetition"`
	FloorOverRawUncontended              float64   `json:"floor_over_raw_uncontended"`
	FloorOverRawContended                float64   `json:"floor_over_raw_contended"`
	// Deferred: the writes an ended LockGrant of the contended runs causes
	// when it is collected, measured on some of them.
	Deferred deferredWrites `json:"deferred_writes"`
	// SteadyWritesPerCycle: the contended run's writes per cycle in the
	// window plus its LockGrant creates per cycle times Deferred.PerGrant.
	SteadyWritesPerCycle float64 `json:"steady_state_writes_per_contended_cycle"`
	// OperatorCPUShare: the operator's CPU over all processes' in a
	// contended cycle (0 with -in-process: not separable).
	OperatorCPUShare float64 `json:"operator_cpu_share_of_contended_cycle"`
	// Sweep: fencekeeper's FIFO against the raw Lease herd, with more
	// clients on one resource.
	Sweep []sweepPoint `json:"waiter_sweep"`
}

// deferredWrites: what collecting ended LockGrants costs the API server.
type deferredWrites struct {
	Grants   int                `json:"grants_deleted"`
	PerGrant float64            `json:"writes_per_grant"`
	ByKind   map[string]float64 `json:"writes_per_grant_by_resource"`
	Seconds  float64            `json:"seconds_until_gone"`
}

type sweepPoint struct {
	Clients     int     `json:"clients_on_one_resource"`
	Fencekeeper float64 `json:"fencekeeper_cycles_per_second"`
	Raw         float64 `json:"raw_cycles_per_second"`
	Ratio       float64 `json:"fencekeeper_over_raw"`
}

type tputRun struct {
	Name      string  `json:"name"`
	Resources int     `json:"resources"`
	Cycles    int     `json:"cycles"`
	PerSecond float64 `json:"cycles_per_second"`
	// PerSecondReps: cycles/s of each repetition's window.
	PerSecondReps []float64 `json:"cycles_per_second_by_repetition"`
	Cycle         dist      `json:"cycle_latency"`
	// WritesPerCycle counts every mutating request the API server served in
	// the window (its apiserver_request_total), per completed cycle;
	// ClientWritesPerCycle only the workers' own.
	WritesPerCycle       float64            `json:"api_writes_per_cycle"`
	ClientWritesPerCycle float64            `json:"client_writes_per_cycle"`
	Conflicts            float64            `json:"client_cas_conflicts_per_cycle"`
	WriteBreakdown       map[string]float64 `json:"api_writes_per_cycle_by_resource"`
	// ReadBreakdown is the reads (GET, LIST, WATCH: the API server counts a
	// watch when it ends) per cycle by resource, with the same keys.
	ReadBreakdown map[string]float64 `json:"api_reads_per_cycle_by_resource"`
	// CPUPerCycle is each process's CPU milliseconds per completed cycle in
	// the window; MachineBusy the fraction of the machine's CPU in use. With
	// the machine near 1, cycles/s is CPU per cycle divided into the cores.
	CPUPerCycle map[string]float64 `json:"cpu_ms_per_cycle_by_process"`
	MachineBusy float64            `json:"machine_busy"`
	// ReconcilesPerCycle: the operator's reconciles per cycle, by controller
	// (controller_runtime_reconcile_total).
	ReconcilesPerCycle map[string]float64 `json:"operator_reconciles_per_cycle_by_controller"`
}

// countingTransport counts a client's mutating requests and 409 answers.
type countingTransport struct {
	writes, conflicts atomic.Int64
}

func (c *countingTransport) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if req.Method != http.MethodGet {
			c.writes.Add(1)
			if err == nil && resp.StatusCode == http.StatusConflict {
				c.conflicts.Add(1)
			}
		}
		return resp, err
	})
}

// cycler runs one closed-loop client's cycles.
type cycler func(ctx context.Context) error

// tputKind is one mechanism at one contention: its clients, and the windows
// measured so far.
type tputKind struct {
	name      string
	resources int
	cyclers   []cycler
	count     *countingTransport
	windows   []tputWindow
}

// The eight kinds of the throughput phase, in this order.
const (
	rawUncontended = iota
	fkUncontended
	floorUncontended
	phaseFloorUncontended
	rawContended
	fkContended
	floorContended
	phaseFloorContended
	tputKinds
)

func (r *report) throughput(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const ns = "bench-throughput"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx) // ends the floor issuers
	defer cancel()
	t := &throughputResult{Clients: cfg.clients, Window: cfg.tputDuration.String(), Repetitions: repetitionCount}
	r.Throughput = t
	kinds, err := e.throughputKinds(ctx, cfg, ns)
	if err != nil {
		return err
	}
	// Repetitions of all kinds, the order rotated by one each time.
	for rep := 0; rep < repetitionCount; rep++ {
		for i := range kinds {
			k := kinds[(i+rep)%len(kinds)]
			stopProfiles := e.profiling(ctx, cfg, "throughput", "throughput-"+slug(k.name), log)
			w, err := e.closedLoop(ctx, cfg, k.cyclers, k.count)
			stopProfiles()
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			k.windows = append(k.windows, w)
			fmt.Fprintf(log, "   %d/%d %s: %.1f cycles/s\n", rep+1, repetitionCount, k.name, w.perSecond())
		}
	}
	for _, k := range kinds {
		t.Runs = append(t.Runs, k.run())
	}
	over := func(a, b, rep int) float64 {
		return ratio(kinds[a].windows[rep].perSecond(), kinds[b].windows[rep].perSecond())
	}
	for rep := 0; rep < repetitionCount; rep++ {
		t.OverFloorUncontended = append(t.OverFloorUncontended, over(fkUncontended, floorUncontended, rep))
		t.OverFloorContended = append(t.OverFloorContended, over(fkContended, floorContended, rep))
		t.PhaseFloorOverFloorUncontended = append(t.PhaseFloorOverFloorUncontended, over(phaseFloorUncontended, floorUncontended, rep))
		t.PhaseFloorOverFloorContended = append(t.PhaseFloorOverFloorContended, over(phaseFloorContended, floorContended, rep))
		t.FencekeeperOverPhaseFloorUncontended = append(t.FencekeeperOverPhaseFloorUncontended, over(fkUncontended, phaseFloorUncontended, rep))
		t.FencekeeperOverPhaseFloorContended = append(t.FencekeeperOverPhaseFloorContended, over(fkContended, phaseFloorContended, rep))
	}
	if t.Deferred, err = e.collectEnded(ctx, ns, "t-con-", 100); err != nil {
		return fmt.Errorf("deferred writes: %w", err)
	}
	if t.Sweep, err = e.waiterSweep(ctx, cfg, ns, log); err != nil {
		return fmt.Errorf("waiter sweep: %w", err)
	}
	r.judgeThroughput(t, cfg)
	return nil
}

// throughputKinds sets up the kinds' clients and resources. The floors
// copy the status of fencekeeper's resources after a first unmeasured
// window, so their registry objects have fencekeeper's size, and the status
// phase floors the status of one of its released LockGrants.
func (e *env) throughputKinds(ctx context.Context, cfg *config, ns string) ([]*tputKind, error) {
	kinds := make([]*tputKind, tputKinds)
	mk := func(i int, name string, resources int) *tputKind {
		kinds[i] = &tputKind{name: name, resources: resources, count: &countingTransport{}}
		return kinds[i]
	}
	for _, spec := range []struct {
		raw, fk, floor, phaseFloor int
		label, prefix              string
		resources                  int
	}{
		{rawUncontended, fkUncontended, floorUncontended, phaseFloorUncontended, "uncontended", "t-unc", cfg.clients},
		{rawContended, fkContended, floorContended, phaseFloorContended, "contended", "t-con", cfg.contendedOn},
	} {
		raw, err := e.rawCyclers(ctx, ns, spec.prefix+"-raw", cfg.clients, spec.resources, mk(spec.raw, "raw two-CAS, "+spec.label, spec.resources))
		if err != nil {
			return nil, err
		}
		kinds[spec.raw].cyclers = raw
		fk := mk(spec.fk, "fencekeeper, "+spec.label, spec.resources)
		if fk.cyclers, err = e.fencekeeperCyclers(ctx, ns, spec.prefix, cfg.clients, spec.resources, fk.count); err != nil {
			return nil, err
		}
		if _, err := e.closedLoop(ctx, cfg, fk.cyclers, &countingTransport{}); err != nil { // fills the registry's history
			return nil, fmt.Errorf("%s: %w", fk.name, err)
		}
		template := spec.prefix + "-0"
		phases, err := e.releasedStatusPatch(ctx, ns, template)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fk.name, err)
		}
		if spec.fk == fkUncontended {
			fl := mk(spec.floor, "custom-resource floor (4 writes), uncontended", spec.resources)
			if fl.cyclers, err = e.floorCyclers(ctx, cfg, ns, "floor", template, nil, fl.count); err == nil {
				fl = mk(spec.phaseFloor, "floor with the status phase (5 writes), uncontended", spec.resources)
				fl.cyclers, err = e.floorCyclers(ctx, cfg, ns, "phase-floor", template, phases, fl.count)
			}
		} else {
			fl := mk(spec.floor, "custom-resource floor (3 writes), contended", spec.resources)
			if fl.cyclers, err = e.contendedFloor(ctx, ns, "floor-con", template, cfg.clients, spec.resources, nil, fl.count); err == nil {
				fl = mk(spec.phaseFloor, "floor with the status phase (4 writes), contended", spec.resources)
				fl.cyclers, err = e.contendedFloor(ctx, ns, "phase-floor-con", template, cfg.clients, spec.resources, phases, fl.count)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("custom-resource floor, %s: %w", spec.label, err)
		}
	}
	return kinds, nil
}

// rawCyclers: clients closed loops of two Lease CASes on resources Leases.
func (e *env) rawCyclers(ctx context.Context, ns, prefix string, clients, resources int, k *tputKind) ([]cycler, error) {
	var out []cycler
	for c := 0; c < clients; c++ {
		res := fmt.Sprintf("%s-%d", prefix, c%resources)
		cs, id, err := countedRawWorker(e, k.count)
		if err != nil {
			return nil, err
		}
		if c < resources {
			if err := createRawLease(ctx, e.adminC, ns, res); err != nil {
				return nil, err
			}
		}
		l := &rawLease{cs: cs, ns: ns, name: res, id: id}
		out = append(out, func(ctx context.Context) error {
			held, err := l.acquire(ctx, nil)
			if err != nil {
				return err
			}
			return l.release(ctx, held)
		})
	}
	return out, nil
}

// fencekeeperCyclers: clients lockclient workers, Acquire → Release on
// resources FencedResources named prefix-0….
func (e *env) fencekeeperCyclers(ctx context.Context, ns, prefix string, clients, resources int, count *countingTransport) ([]cycler, error) {
	var out []cycler
	for c := 0; c < clients; c++ {
		res := fmt.Sprintf("%s-%d", prefix, c%resources)
		if c < resources {
			if err := e.fencedResource(ctx, ns, res, 60, ""); err != nil {
				return nil, err
			}
		}
		lc, err := countedWorker(ctx, e, ns, count)
		if err != nil {
			return nil, err
		}
		out = append(out, func(ctx context.Context) error {
			l, err := lc.Acquire(ctx, res, lockclient.AcquireOptions{})
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	}
	return out, nil
}

// judgeThroughput sets the pooled ratios and judges the throughput lines:
// against the floors (tail rule over the repetitions), writes per
// contended cycle in the window and at steady state, the operator's share
// of a cycle's CPU; the raw ratios are reported.
func (r *report) judgeThroughput(t *throughputResult, cfg *config) {
	run := func(i int) tputRun { return t.Runs[i] }
	t.FloorOverRawUncontended = ratio(run(floorUncontended).PerSecond, run(rawUncontended).PerSecond)
	t.FloorOverRawContended = ratio(run(floorContended).PerSecond, run(rawContended).PerSecond)
	t.UncontendedRatio = ratio(run(fkUncontended).PerSecond, run(rawUncontended).PerSecond)
	t.ContendedRatio = ratio(run(fkContended).PerSecond, run(rawContended).PerSecond)
	con := run(fkContended)
	r.judgeTail("uncontended throughput against the floor", "fencekeeper cycles/s ≥ 0.9× the 4-write floor's, per repetition",
		t.OverFloorUncontended, atLeast(0.9), "×",
		fmt.Sprintf("%d clients on %d resources, pooled: fencekeeper %s cycles/s, floor %s", cfg.clients, cfg.clients, fmtF(run(fkUncontended).PerSecond), fmtF(run(floorUncontended).PerSecond)))
	r.judgeTail("contended throughput against the floor", "fencekeeper cycles/s ≥ 0.8× the 3-write floor's, per repetition",
		t.OverFloorContended, atLeast(0.8), "×",
		fmt.Sprintf("%d clients on %d resources, pooled: fencekeeper %s cycles/s, floor %s", cfg.clients, cfg.contendedOn, fmtF(con.PerSecond), fmtF(run(floorContended).PerSecond)))
	writes := con.WritesPerCycle
	if con.Cycles == 0 {
		writes = math.NaN()
	}
	r.judge("API writes per contended cycle, in the window", "≤ 4.1, every client's and the operator's (by resource below the throughput table)", writes, atMost(4.1), "", "")
	t.SteadyWritesPerCycle = math.NaN()
	if con.Cycles > 0 && t.Deferred.Grants > 0 {
		t.SteadyWritesPerCycle = round2(writes + con.WriteBreakdown["lockgrants POST"]*t.Deferred.PerGrant)
	}
	r.judge("API writes per contended cycle, steady state", "≤ 5.1: the window's, and the writes its LockGrants cause when collected", t.SteadyWritesPerCycle, atMost(5.1), "",
		fmt.Sprintf("%s LockGrant creates per cycle × %s writes each when collected (measured on %d of them: %s)",
			fmtF(con.WriteBreakdown["lockgrants POST"]), fmtF(t.Deferred.PerGrant), t.Deferred.Grants, breakdown(t.Deferred.ByKind)))
	if cfg.inProcess { // the operator's CPU is the bench process's
		r.addTarget(target{Name: "operator CPU in a contended cycle", Rule: "≤ 10 % of the cycle's CPU (all processes)", Measured: math.NaN(),
			Unit: "%", Verdict: verdictReported, Detail: "not separable with -in-process"})
	} else {
		t.OperatorCPUShare = math.NaN()
		if total := sumValues(con.CPUPerCycle); total > 0 && con.CPUPerCycle["manager"] > 0 {
			t.OperatorCPUShare = round2(con.CPUPerCycle["manager"] / total)
		}
		r.judge("operator CPU in a contended cycle", "≤ 10 % of the cycle's CPU (all processes)", t.OperatorCPUShare*100, atMost(10), "%",
			fmt.Sprintf("CPU ms per cycle: %s", breakdown(con.CPUPerCycle)))
	}
	for _, c := range []struct {
		label, floor    string
		ceiling, beyond []float64
	}{
		{"uncontended", "4-write", t.PhaseFloorOverFloorUncontended, t.FencekeeperOverPhaseFloorUncontended},
		{"contended", "3-write", t.PhaseFloorOverFloorContended, t.FencekeeperOverPhaseFloorContended},
	} {
		r.report(c.label+" throughput against the floor with the status phase", "fencekeeper cycles/s / the floor's that also writes each LockGrant's final status, median of the repetitions",
			medianOf(c.beyond), fmt.Sprintf("repetitions %s; that floor over the %s floor (the most the line above can reach under the contract): %s× (%s)",
				repsString(c.beyond), c.floor, fmtF(medianOf(c.ceiling)), repsString(c.ceiling)))
	}
	r.report("throughput against raw Lease", "fencekeeper contended cycles/s / raw two-CAS", t.ContendedRatio,
		fmt.Sprintf("uncontended %s×; the floors alone: %s× contended, %s× uncontended", fmtF(t.UncontendedRatio), fmtF(t.FloorOverRawContended), fmtF(t.FloorOverRawUncontended)))
	for _, p := range t.Sweep {
		r.report(fmt.Sprintf("%d clients on one resource against the raw herd", p.Clients), "fencekeeper FIFO cycles/s / raw Lease CAS+watch",
			p.Ratio, fmt.Sprintf("fencekeeper %s cycles/s, raw %s", fmtF(p.Fencekeeper), fmtF(p.Raw)))
	}
}

func sumValues(m map[string]float64) float64 {
	total := 0.0
	for _, v := range m {
		total += v
	}
	return total
}

// floorCyclers: the uncontended custom-resource floor (floor.go), as many
// clients as the other runs, each on its own registry object (named
// prefix-r0…) copying the status of fencekeeper's registry object template;
// with phases, a status merge patch, each ended LockGrant also gets its
// status phase (floorphase.go).
func (e *env) floorCyclers(ctx context.Context, cfg *config, ns, prefix, template string, phases []byte, count *countingTransport) ([]cycler, error) {
	tmpl, err := e.floorTemplateOf(ctx, ns, template)
	if err != nil {
		return nil, err
	}
	var cyclers []cycler
	for c := 0; c < cfg.clients; c++ {
		dyn, owner, err := e.floorClient(count)
		if err != nil {
			return nil, err
		}
		signed, err := floorTemplate(tmpl, owner)
		if err != nil {
			return nil, err
		}
		loop, err := newFloorLoop(ctx, dyn, ns, fmt.Sprintf("%s-r%d", prefix, c), tmpl, signed)
		if err != nil {
			return nil, err
		}
		if loop.phases, err = e.floorPhaseWriter(ctx, ns, phases); err != nil {
			return nil, err
		}
		cyclers = append(cyclers, loop.cycle)
	}
	return cyclers, nil
}

// floorPhaseWriter starts a phaseWriter of phases with an identity of its
// own (the issuer's writes are not the clients'); nil without phases.
func (e *env) floorPhaseWriter(ctx context.Context, ns string, phases []byte) (*phaseWriter, error) {
	if phases == nil {
		return nil, nil
	}
	dyn, _, err := e.floorClient(&countingTransport{})
	if err != nil {
		return nil, err
	}
	return startPhaseWriter(ctx, dyn, ns, phases), nil
}

func countedRawWorker(e *env, count *countingTransport) (kubernetes.Interface, string, error) {
	cfg, name, err := e.user("raw", rawGroup)
	if err != nil {
		return nil, "", err
	}
	cfg.Wrap(count.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, name, err
}

func countedWorker(ctx context.Context, e *env, ns string, count *countingTransport) (*lockclient.Client, error) {
	cfg, _, err := e.user("worker", localcp.WorkersGroup)
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(count.wrap)
	return lockclient.NewForConfig(ctx, cfg, ns)
}

// tputWindow is what one measured window of a closed loop saw.
type tputWindow struct {
	cycles                  int
	seconds                 float64
	lat                     []time.Duration
	api                     map[string]float64 // API requests served in the window, by resource and verb
	clientWrites, conflicts int64
	cpu0, cpu1              cpuSample
	reconciles              map[string]float64 // the operator's reconciles in the window, by controller
}

func (w tputWindow) perSecond() float64 {
	if w.seconds <= 0 {
		return 0
	}
	return float64(w.cycles) / w.seconds
}

// run pools the kind's windows into one run.
func (k *tputKind) run() tputRun {
	run := tputRun{Name: k.name, Resources: k.resources}
	var (
		lat             []time.Duration
		seconds         float64
		api             = map[string]float64{}
		writes, conflic int64
		cpu             = map[string]float64{}
		reconciles      = map[string]float64{}
		busy, all       float64
	)
	for _, w := range k.windows {
		run.Cycles += w.cycles
		seconds += w.seconds
		lat = append(lat, w.lat...)
		for key, v := range w.api {
			api[key] += v
		}
		writes, conflic = writes+w.clientWrites, conflic+w.conflicts
		for p, v := range w.cpu1.byProcess {
			cpu[p] += v - w.cpu0.byProcess[p]
		}
		for c, v := range w.reconciles {
			reconciles[c] += v
		}
		busy += w.cpu1.machineBusy - w.cpu0.machineBusy
		all += w.cpu1.machineAll - w.cpu0.machineAll
		run.PerSecondReps = append(run.PerSecondReps, round2(w.perSecond()))
	}
	run.Cycle = summarize(lat)
	if seconds > 0 {
		run.PerSecond = float64(run.Cycles) / seconds
	}
	if all > 0 {
		run.MachineBusy = round2(busy / all)
	}
	n := float64(run.Cycles)
	if n == 0 {
		return run
	}
	total := 0.0
	run.WriteBreakdown, run.ReadBreakdown, run.CPUPerCycle = map[string]float64{}, map[string]float64{}, map[string]float64{}
	for key, v := range api {
		if !isWrite(key) {
			run.ReadBreakdown[key] = round2(v / n)
			continue
		}
		total += v
		run.WriteBreakdown[key] = round2(v / n)
	}
	run.WritesPerCycle = round2(total / n)
	run.ClientWritesPerCycle = round2(float64(writes) / n)
	run.Conflicts = round2(float64(conflic) / n)
	for p, v := range cpu {
		run.CPUPerCycle[p] = round2(v * 1000 / n)
	}
	if len(reconciles) > 0 {
		run.ReconcilesPerCycle = map[string]float64{}
		for c, v := range reconciles {
			run.ReconcilesPerCycle[c] = round2(v / n)
		}
	}
	return run
}

// closedLoop runs every cycler back to back: a warm-up, then a measured
// window. The window runs from the middle of the API server's first counter
// read to the middle of its second, so that the writes counted and the
// cycles counted (those that completed inside it) cover the same time.
func (e *env) closedLoop(ctx context.Context, cfg *config, cyclers []cycler, count *countingTransport) (tputWindow, error) {
	type done struct {
		end time.Time
		lat time.Duration
	}
	var (
		w         tputWindow
		mu        sync.Mutex
		cycles    []done
		firstErr  error
		stop      atomic.Bool
		wg        sync.WaitGroup
		cycleCtx  context.Context
		cancelAll context.CancelFunc
	)
	cycleCtx, cancelAll = context.WithCancel(ctx)
	defer cancelAll()
	for _, c := range cyclers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				t := time.Now()
				if err := c(cycleCtx); err != nil {
					mu.Lock()
					if firstErr == nil && cycleCtx.Err() == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				end := time.Now()
				mu.Lock()
				cycles = append(cycles, done{end, end.Sub(t)})
				mu.Unlock()
			}
		}()
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(cfg.tputWarmup); err != nil {
		return w, err
	}
	rec0 := e.reconciles(ctx)
	t0 := time.Now()
	before, err := e.apiRequests(ctx)
	if err != nil {
		return w, err
	}
	start := t0.Add(time.Since(t0) / 2)
	w0, c0 := count.writes.Load(), count.conflicts.Load()
	w.cpu0 = sampleCPU()
	if err := sleep(cfg.tputDuration); err != nil {
		return w, err
	}
	w.cpu1 = sampleCPU()
	t1 := time.Now()
	after, err := e.apiRequests(ctx)
	if err != nil {
		return w, err
	}
	end := t1.Add(time.Since(t1) / 2)
	w1, c1 := count.writes.Load(), count.conflicts.Load()
	w.reconciles = diffCounts(e.reconciles(ctx), rec0)
	stop.Store(true)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		cancelAll()
		<-finished
		return w, fmt.Errorf("cycles still running a minute after the window ended (an issuer stuck?)")
	}
	if firstErr != nil {
		return w, firstErr
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range cycles {
		if !c.end.Before(start) && !c.end.After(end) {
			w.lat = append(w.lat, c.lat)
		}
	}
	w.cycles, w.seconds = len(w.lat), end.Sub(start).Seconds()
	w.api = diffCounts(after, before)
	w.clientWrites, w.conflicts = w1-w0, c1-c0
	return w, nil
}

// reconciles is the operator's controller_runtime_reconcile_total by
// controller (nil when its metrics cannot be read).
func (e *env) reconciles(ctx context.Context) map[string]float64 {
	raw, err := e.op.Metrics(ctx)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for series, v := range parseMetrics(raw) {
		if strings.HasPrefix(series, "controller_runtime_reconcile_total{") {
			out[parseLabels(series)["controller"]] += v
		}
	}
	return out
}

// collectEnded measures what collecting ended LockGrants costs: it deletes
// up to n ended LockGrants of the resources named prefix… as the collector
// does (UID and resourceVersion preconditions), waits until they are gone
// and counts the LockGrant and FencedResource writes the API server served
// meanwhile (the deletes, and what the operator writes to let them go).
func (e *env) collectEnded(ctx context.Context, ns, prefix string, n int) (deferredWrites, error) {
	var d deferredWrites
	time.Sleep(2 * time.Second) // the last cycles' writes land first
	var list locksv1.LockGrantList
	if err := e.admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return d, err
	}
	var due []locksv1.LockGrant
	for _, lg := range list.Items {
		if len(due) < n && strings.HasPrefix(lg.Spec.Resource, prefix) && lg.Status.Phase.Terminal() && lg.DeletionTimestamp == nil {
			due = append(due, lg)
		}
	}
	if len(due) == 0 {
		return d, fmt.Errorf("no ended LockGrant of %s… in %s", prefix, ns)
	}
	before, err := e.apiRequests(ctx)
	if err != nil {
		return d, err
	}
	start := time.Now()
	for i := range due {
		lg := &due[i]
		uid, rv := lg.UID, lg.ResourceVersion
		target := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: lg.Namespace, Name: lg.Name}}
		if err := e.admin.Delete(ctx, target, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil {
			return d, fmt.Errorf("delete %s: %w", lg.Name, err)
		}
	}
	for i := range due {
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := e.admin.Get(ctx, client.ObjectKeyFromObject(&due[i]), &locksv1.LockGrant{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		}); err != nil {
			return d, fmt.Errorf("LockGrant %s not gone a minute after its delete: %w", due[i].Name, err)
		}
	}
	d.Seconds = round2(time.Since(start).Seconds())
	time.Sleep(time.Second) // writes that follow the last removal
	after, err := e.apiRequests(ctx)
	if err != nil {
		return d, err
	}
	d.Grants, d.ByKind = len(due), map[string]float64{}
	total := 0.0
	for key, v := range diffCounts(after, before) {
		if isWrite(key) && (strings.HasPrefix(key, "lockgrants") || strings.HasPrefix(key, "fencedresources")) {
			total += v
			d.ByKind[key] = round2(v / float64(len(due)))
		}
	}
	d.PerGrant = round2(total / float64(len(due)))
	return d, nil
}

// waiterSweep measures fencekeeper's FIFO against the raw Lease herd with
// more and more clients on one resource: one window each, the two
// mechanisms alternating which goes first.
func (e *env) waiterSweep(ctx context.Context, cfg *config, ns string, log io.Writer) ([]sweepPoint, error) {
	var out []sweepPoint
	for i, n := range cfg.sweep {
		k := &tputKind{count: &countingTransport{}}
		raw, err := e.rawCyclers(ctx, ns, fmt.Sprintf("t-sweep%d-raw", n), n, 1, k)
		if err != nil {
			return nil, err
		}
		fk, err := e.fencekeeperCyclers(ctx, ns, fmt.Sprintf("t-sweep%d", n), n, 1, k.count)
		if err != nil {
			return nil, err
		}
		p := sweepPoint{Clients: n}
		order := []struct {
			cyclers []cycler
			into    *float64
		}{{fk, &p.Fencekeeper}, {raw, &p.Raw}}
		for j := range order {
			o := order[(j+i)%2]
			w, err := e.closedLoop(ctx, cfg, o.cyclers, k.count)
			if err != nil {
				return nil, fmt.Errorf("%d clients: %w", n, err)
			}
			*o.into = round2(w.perSecond())
		}
		p.Ratio = ratio(p.Fencekeeper, p.Raw)
		fmt.Fprintf(log, "   %d clients on one resource: fencekeeper %.1f cycles/s, raw %.1f\n", n, p.Fencekeeper, p.Raw)
		out = append(out, p)
	}
	return out, nil
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// slug is a run's name as a file name: "raw two-CAS, uncontended" →
// "raw-two-cas-uncontended".
func slug(name string) string {
	return strings.Join(strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}), "-")
}
