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

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

type throughputResult struct {
	Clients int       `json:"clients"`
	Window  string    `json:"window"`
	Runs    []tputRun `json:"runs"`
	// ContendedRatio is fencekeeper's contended cycles/s over the raw baseline's.
	ContendedRatio   float64 `json:"contended_ratio_fencekeeper_over_raw"`
	UncontendedRatio float64 `json:"uncontended_ratio_fencekeeper_over_raw"`
	// Floor is the custom-resource floor run (floor.go): four writes per
	// cycle and nothing else. FloorOverRaw* are its cycles/s over each raw
	// baseline's, the best ratio a CPU-bound fencekeeper could reach here.
	Floor                   *tputRun `json:"floor,omitempty"`
	FloorOverRawUncontended float64  `json:"floor_over_raw_uncontended"`
	FloorOverRawContended   float64  `json:"floor_over_raw_contended"`
}

type tputRun struct {
	Name      string  `json:"name"`
	Resources int     `json:"resources"`
	Cycles    int     `json:"cycles"`
	PerSecond float64 `json:"cycles_per_second"`
	Cycle     dist    `json:"cycle_latency"`
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

func (r *report) throughput(ctx context.Context, e *env, cfg *config, log io.Writer) error {
	const ns = "bench-throughput"
	if err := e.namespace(ctx, ns); err != nil {
		return err
	}
	t := &throughputResult{Clients: cfg.clients, Window: cfg.tputDuration.String()}
	r.Throughput = t
	runs := []struct {
		name      string
		raw       bool
		resources int
	}{
		{"raw two-CAS, uncontended", true, cfg.clients},
		{"fencekeeper, uncontended", false, cfg.clients},
		{"raw two-CAS, contended", true, cfg.contendedOn},
		{"fencekeeper, contended", false, cfg.contendedOn},
	}
	for i, spec := range runs {
		count := &countingTransport{}
		var cyclers []cycler
		for c := 0; c < cfg.clients; c++ {
			res := fmt.Sprintf("t%d-r%d", i, c%spec.resources)
			if spec.raw {
				cs, id, err := countedRawWorker(e, count)
				if err != nil {
					return err
				}
				if c < spec.resources {
					if err := createRawLease(ctx, e.adminC, ns, res); err != nil {
						return err
					}
				}
				l := &rawLease{cs: cs, ns: ns, name: res, id: id}
				cyclers = append(cyclers, func(ctx context.Context) error {
					held, err := l.acquire(ctx, nil)
					if err != nil {
						return err
					}
					return l.release(ctx, held)
				})
				continue
			}
			if c < spec.resources {
				if err := e.fencedResource(ctx, ns, res, 60, ""); err != nil {
					return err
				}
			}
			lc, err := countedWorker(ctx, e, ns, count)
			if err != nil {
				return err
			}
			cyclers = append(cyclers, func(ctx context.Context) error {
				l, err := lc.Acquire(ctx, res, lockclient.AcquireOptions{})
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		}
		stopProfiles := e.profiling(ctx, cfg, "throughput", "throughput-"+slug(spec.name), log)
		run, err := e.closedLoop(ctx, cfg, spec.name, spec.resources, cyclers, count)
		stopProfiles()
		if err != nil {
			return fmt.Errorf("%s: %w", spec.name, err)
		}
		fmt.Fprintf(log, "   %s: %.1f cycles/s, %.2f API writes/cycle\n", run.Name, run.PerSecond, run.WritesPerCycle)
		t.Runs = append(t.Runs, run)
	}
	stopProfiles := e.profiling(ctx, cfg, "throughput", "throughput-floor", log)
	floor, err := e.floorRun(ctx, cfg, ns, "t1-r0")
	stopProfiles()
	if err != nil {
		return fmt.Errorf("custom-resource floor: %w", err)
	}
	fmt.Fprintf(log, "   %s: %.1f cycles/s, %.2f API writes/cycle\n", floor.Name, floor.PerSecond, floor.WritesPerCycle)
	r.judgeThroughput(t, &floor, cfg)
	return nil
}

// judgeThroughput sets the ratios of the four runs and the floor, and judges
// the critical-path work's throughput targets.
func (r *report) judgeThroughput(t *throughputResult, floor *tputRun, cfg *config) {
	t.Floor = floor
	t.FloorOverRawUncontended = ratio(floor.PerSecond, t.Runs[0].PerSecond)
	t.FloorOverRawContended = ratio(floor.PerSecond, t.Runs[2].PerSecond)
	t.UncontendedRatio = ratio(t.Runs[1].PerSecond, t.Runs[0].PerSecond)
	t.ContendedRatio = ratio(t.Runs[3].PerSecond, t.Runs[2].PerSecond)
	r.judge("contended throughput", "fencekeeper cycles/s ≥ 0.5× raw two-CAS (shown as raw/fencekeeper ≤ 2)",
		ratio(t.Runs[2].PerSecond, t.Runs[3].PerSecond), 2, "×",
		fmt.Sprintf("%d clients on %d resources: fencekeeper %s cycles/s, raw %s cycles/s (fencekeeper/raw = %s)",
			cfg.clients, cfg.contendedOn, fmtF(t.Runs[3].PerSecond), fmtF(t.Runs[2].PerSecond), fmtF(t.ContendedRatio)))
	r.judge("uncontended throughput", "fencekeeper cycles/s ≥ 0.2× raw two-CAS (shown as raw/fencekeeper ≤ 5)",
		ratio(t.Runs[0].PerSecond, t.Runs[1].PerSecond), 5, "×",
		fmt.Sprintf("%d clients on %d resources: fencekeeper %s cycles/s, raw %s cycles/s (fencekeeper/raw = %s)",
			cfg.clients, cfg.clients, fmtF(t.Runs[1].PerSecond), fmtF(t.Runs[0].PerSecond), fmtF(t.UncontendedRatio)))
	writes := t.Runs[3].WritesPerCycle
	if t.Runs[3].Cycles == 0 {
		writes = math.NaN()
	}
	r.judge("API writes per contended cycle", "≤ 4.5 (all writes, by resource below the throughput table)", writes, 4.5, "", "")
}

// floorRun measures the custom-resource floor (floor.go) with as many
// clients as the other runs, each on its own registry object, copying the
// status of fencekeeper's registry object template.
func (e *env) floorRun(ctx context.Context, cfg *config, ns, template string) (tputRun, error) {
	if err := e.installFloor(ctx); err != nil {
		return tputRun{}, err
	}
	var tmpl locksv1.FencedResource
	if err := e.admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: template}, &tmpl); err != nil {
		return tputRun{}, err
	}
	count := &countingTransport{}
	var cyclers []cycler
	for c := 0; c < cfg.clients; c++ {
		rc, owner, err := e.user("floor", localcp.WorkersGroup)
		if err != nil {
			return tputRun{}, err
		}
		rc = rest.CopyConfig(rc)
		rc.Wrap(count.wrap)
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			return tputRun{}, err
		}
		signed, err := floorTemplate(&tmpl, owner)
		if err != nil {
			return tputRun{}, err
		}
		loop, err := newFloorLoop(ctx, dyn, ns, fmt.Sprintf("floor-r%d", c), &tmpl, signed)
		if err != nil {
			return tputRun{}, err
		}
		cyclers = append(cyclers, loop.cycle)
	}
	return e.closedLoop(ctx, cfg, "custom-resource floor (4 writes), uncontended", cfg.clients, cyclers, count)
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

// closedLoop runs every cycler back to back: a warm-up, then a measured
// window; a cycle counts if it completed inside the window.
func (e *env) closedLoop(ctx context.Context, cfg *config, name string, resources int, cyclers []cycler, count *countingTransport) (tputRun, error) {
	run := tputRun{Name: name, Resources: resources}
	var (
		mu        sync.Mutex
		lat       []time.Duration
		firstErr  error
		stop      atomic.Bool
		winStart  atomic.Int64
		winEnd    atomic.Int64
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
				// A cycle counts when it completed inside the window.
				if s, e := winStart.Load(), winEnd.Load(); s != 0 && end.UnixNano() >= s && (e == 0 || end.UnixNano() <= e) {
					mu.Lock()
					lat = append(lat, end.Sub(t))
					mu.Unlock()
				}
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
		return run, err
	}
	before, err := e.apiRequests(ctx)
	if err != nil {
		return run, err
	}
	w0, c0 := count.writes.Load(), count.conflicts.Load()
	cpu0 := sampleCPU()
	start := time.Now()
	winStart.Store(start.UnixNano())
	if err := sleep(cfg.tputDuration); err != nil {
		return run, err
	}
	end := time.Now()
	winEnd.Store(end.UnixNano())
	cpu1 := sampleCPU()
	after, err := e.apiRequests(ctx)
	if err != nil {
		return run, err
	}
	w1, c1 := count.writes.Load(), count.conflicts.Load()
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cancelAll()
		<-done
	}
	if firstErr != nil {
		return run, firstErr
	}
	mu.Lock()
	n := len(lat)
	mu.Unlock()
	run.Cycle = summarize(lat)
	window := end.Sub(start).Seconds()
	run.Cycles = n
	run.PerSecond = float64(n) / window
	if n > 0 {
		total := 0.0
		run.WriteBreakdown, run.ReadBreakdown = map[string]float64{}, map[string]float64{}
		for k, v := range diffCounts(after, before) {
			if !isWrite(k) {
				if v > 0 {
					run.ReadBreakdown[k] = round2(v / float64(n))
				}
				continue
			}
			total += v
			run.WriteBreakdown[k] = round2(v / float64(n))
		}
		run.WritesPerCycle = round2(total / float64(n))
		run.ClientWritesPerCycle = round2(float64(w1-w0) / float64(n))
		run.Conflicts = round2(float64(c1-c0) / float64(n))
	}
	run.CPUPerCycle, run.MachineBusy = cpuPerCycle(cpu0, cpu1, n)
	return run, nil
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// slug is a run's name as a file name: "raw two-CAS, uncontended" →
// "raw-two-cas-uncontended".
func slug(name string) string {
	return strings.Join(strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}), "-")
}
