// Command bench measures fencekeeper against raw baselines on one embedded
// control plane (etcd + kube-apiserver from bin/k8s) with the real operator:
// release and expiry handoff, acquire/release throughput, the acceptance
// webhook's overhead, scale to 10,000 FencedResources and what registry-keyed
// protection costs writes to non-targets. It prints a table, writes a JSON
// file and SVG plots, and judges each target against a floor or control
// measured in the same run, interleaved: PASS or FAIL, and for lines
// measured in five rotated repetitions PASS, FAIL or INCONCLUSIVE by the
// tail rule (verdict.go). Ratios against raw Kubernetes primitives are
// printed beside them, not judged.
//
//	go run ./test/bench            # the full run (make bench)
//	go run ./test/bench -quick     # a smoke run, well under a minute
//	go run ./test/bench -only soak # the hostile-tenant soak (make soak), never part of the default run
//
// See docs/performance.md for the method.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

type config struct {
	quick         bool
	inProcess     bool
	maxReconciles int
	out           string
	cpuProfile    string
	only          map[string]bool
	failOnMiss    bool
	dumpMetrics   bool
	profilePhase  string
	profileDir    string

	warmup, handoffs     int
	leHandoffs           int
	leRetry              time.Duration
	expiries, expiryPar  int
	tputDuration         time.Duration
	tputWarmup           time.Duration
	clients, contendedOn int
	sweep                []int
	rates                []float64
	webhookSamples       int
	scaleSizes           []int
	scaleHandoffs        int
	scaleHeld            int
	scaleRSS             float64
	failover             bool
	operatorMemLimit     int64
	scaleWebhook         int
	loaders              int
	ntEntries, ntSamples int
	ntBudget             time.Duration
	ntFill               bool
	ntRate               float64

	soak soakConfig
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	var rates, sizes, only, sweep string
	fs.BoolVar(&c.quick, "quick", false, "Smoke run: small samples everywhere (under a minute); the figures are not meaningful.")
	fs.BoolVar(&c.inProcess, "in-process", false, "Run the operator in this process instead of cmd/manager as a child (for -cpuprofile; memory figures then include the bench).")
	fs.IntVar(&c.maxReconciles, "max-concurrent-reconciles", 4, "The operator's --max-concurrent-reconciles (cmd/manager's default is 4).")
	fs.StringVar(&c.out, "out", "bin/bench/results.json", "Where to write the JSON results (relative to the repository root).")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "Write a CPU profile of this process (with -in-process it includes the operator).")
	fs.StringVar(&only, "only", "", "Comma-separated phases to run (handoff,expiry,throughput,webhook,micro,scale,nontarget; soak runs only when named here); default all but soak.")
	fs.BoolVar(&c.dumpMetrics, "dump-metrics", false, "Write the operator's and the API server's Prometheus metrics to bin/bench/*-metrics.txt at the end (for diagnosis).")
	fs.StringVar(&c.profilePhase, "profile-phase", "", "Capture CPU profiles while this phase runs: kube-apiserver's /debug/pprof and the operator's (its pprof endpoint; with -in-process, this process's); scale also takes both heap profiles at each size.")
	fs.StringVar(&c.profileDir, "profile-dir", "bin/bench/profiles", "Where -profile-phase writes its profiles.")
	fs.BoolVar(&c.failOnMiss, "fail-on-miss", false, "Exit 2 when a target is missed (default: exit 0 once the run completed).")
	fs.IntVar(&c.warmup, "warmup", 30, "Handoffs discarded before each release-handoff sample.")
	fs.IntVar(&c.handoffs, "handoffs", 1000, "Release handoffs measured, fencekeeper and raw CAS+watch each.")
	fs.IntVar(&c.leHandoffs, "le-handoffs", 100, "client-go leaderelection handoffs measured (each waits up to ~2.2 retry periods).")
	fs.DurationVar(&c.leRetry, "le-retry", 100*time.Millisecond, "client-go leaderelection RetryPeriod of the reference.")
	fs.IntVar(&c.expiries, "expiries", 250, "Expiry handoffs measured (1 s leases).")
	fs.IntVar(&c.expiryPar, "expiry-parallel", 8, "Resources whose expiry chains run side by side, staggered.")
	fs.DurationVar(&c.tputDuration, "throughput-duration", 4*time.Second, "Measured window of each throughput run (each of the eight runs has five).")
	fs.DurationVar(&c.tputWarmup, "throughput-warmup", time.Second, "Unmeasured warm-up before each throughput window.")
	fs.IntVar(&c.clients, "clients", 8, "Closed-loop clients C of the throughput runs.")
	fs.IntVar(&c.contendedOn, "contended-resources", 2, "Shared resources of the contended throughput runs.")
	fs.StringVar(&sweep, "sweep", "4,16,64", "Clients on one resource of the waiter sweep (fencekeeper against the raw Lease herd, reported); empty: none.")
	fs.StringVar(&rates, "rates", "25,50,100", "Request rates (updates/s, protected and unprotected together) of the webhook-overhead runs.")
	fs.IntVar(&c.webhookSamples, "webhook-samples", 1000, "Requests measured per kind (protected update, unprotected update, registry GET) at each rate.")
	fs.StringVar(&sizes, "scale", "1000,10000", "FencedResource counts of the scale runs, each with an active grant.")
	fs.IntVar(&c.scaleHeld, "scale-held", 0, "Of each scale size's FencedResources, at most this many hold a grant (0: every one); the rest are idle entries.")
	fs.Float64Var(&c.scaleRSS, "scale-rss-limit", 256, "The operator's peak RSS limit (MiB) at the largest scale size, per replica.")
	fs.BoolVar(&c.failover, "failover", false, "After the largest scale size, start a standby replica, kill the leader (SIGKILL) and time the takeover: first grant and every waiting request served (make bench-scale).")
	fs.Int64Var(&c.operatorMemLimit, "operator-memory-limit", 0, "Pass --memory-limit (bytes) to cmd/manager, as the Deployment passes its container's limit: the Go heap aims to stay under 90 % of it (0: Go's default).")
	fs.IntVar(&c.scaleHandoffs, "scale-handoffs", 600, "Release handoffs measured at each scale size.")
	fs.IntVar(&c.scaleWebhook, "scale-webhook-samples", 2000, "Protected and unprotected updates measured at each scale size.")
	fs.IntVar(&c.loaders, "loaders", 8, "Parallel clients creating the scale runs' FencedResources and grants.")
	fs.IntVar(&c.ntEntries, "nontarget-entries", 10000, "FencedResources (each with a ConfigMap target) in the enrolled namespace of the non-target run.")
	fs.DurationVar(&c.ntBudget, "nontarget-setup-budget", 5*time.Minute, "Stop creating the non-target run's entries after this long and measure with what exists (0: create them all; 10,000 takes far longer, see docs/performance.md).")
	fs.BoolVar(&c.ntFill, "nontarget-fill", true, "When the setup budget ends the non-target run's load early, add entries without a target (admitted without a list) up to -nontarget-entries.")
	fs.IntVar(&c.ntSamples, "nontarget-samples", 1000, "Requests measured per kind in the non-target run, over its repetitions (unprotected, non-target, non-target naming an entry, protected, registry GET, and creates: unprotected, non-target).")
	fs.Float64Var(&c.ntRate, "nontarget-rate", 100, "Requests/s of the non-target run, all seven kinds together.")
	c.soak.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("warmup", func() { c.warmup = 3 })
		def("handoffs", func() { c.handoffs = 20 })
		def("le-handoffs", func() { c.leHandoffs = 5 })
		def("expiries", func() { c.expiries = 8 })
		def("expiry-parallel", func() { c.expiryPar = 4 })
		def("throughput-duration", func() { c.tputDuration = 1500 * time.Millisecond })
		def("throughput-warmup", func() { c.tputWarmup = 500 * time.Millisecond })
		def("clients", func() { c.clients = 4 })
		def("sweep", func() { sweep = "2,4" })
		def("rates", func() { rates = "50" })
		def("webhook-samples", func() { c.webhookSamples = 30 })
		def("scale", func() { sizes = "20,60" })
		def("scale-handoffs", func() { c.scaleHandoffs = 10 })
		def("scale-webhook-samples", func() { c.scaleWebhook = 10 })
		def("nontarget-entries", func() { c.ntEntries = 40 })
		def("nontarget-samples", func() { c.ntSamples = 20 })
	}
	var err error
	if c.rates, err = parseList(rates, strconv.ParseFloat); err != nil {
		return nil, fmt.Errorf("-rates: %w", err)
	}
	if c.sweep, err = parseList(sweep, func(s string, _ int) (int, error) { return strconv.Atoi(s) }); err != nil {
		return nil, fmt.Errorf("-sweep: %w", err)
	}
	if c.scaleSizes, err = parseList(sizes, func(s string, _ int) (int, error) { return strconv.Atoi(s) }); err != nil {
		return nil, fmt.Errorf("-scale: %w", err)
	}
	if only != "" {
		c.only = map[string]bool{}
		for _, p := range strings.Split(only, ",") {
			c.only[strings.TrimSpace(p)] = true
		}
	}
	return c, nil
}

// heldAt is how many of size scale entries hold a grant.
func (c *config) heldAt(size int) int {
	if c.scaleHeld <= 0 {
		return size
	}
	return min(size, c.scaleHeld)
}

func parseList[T any](s string, parse func(string, int) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// runs reports whether phase is selected: the soak only when named in -only
// (it is minutes of hostile load, not a benchmark), the others by default.
func (c *config) runs(phase string) bool {
	if phase == soakPhase {
		return c.only[phase]
	}
	return c.only == nil || c.only[phase]
}

// workDir holds the operator binary the bench builds and its log: the
// directory of the results file (bin/bench by default), so that a run with
// -out elsewhere writes nothing into bin/.
func (c *config) workDir(root string) string {
	if c.out == "" {
		return filepath.Join(root, "bin", "bench")
	}
	return filepath.Dir(c.out)
}

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the bench and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return 2
	}
	// The operator's and client-go's logs would drown the table.
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, cfg, stdout)
	if rep != nil {
		rep.print(stdout)
		if path, werr := rep.write(cfg.out); werr != nil {
			fmt.Fprintf(stderr, "write results: %v\n", werr)
		} else {
			fmt.Fprintf(stdout, "\nJSON: %s\n", path)
		}
		if paths, perr := rep.writePlots(filepath.Dir(cfg.out)); perr != nil {
			fmt.Fprintf(stderr, "write plots: %v\n", perr)
		} else if len(paths) > 0 {
			fmt.Fprintf(stdout, "plots: %s\n", strings.Join(paths, ", "))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	if cfg.failOnMiss && !rep.allPass() {
		return 2
	}
	return 0
}

func run(ctx context.Context, cfg *config, log io.Writer) (*report, error) {
	root, err := localcp.RepoRoot()
	if err != nil {
		return nil, err
	}
	if !filepath.IsAbs(cfg.out) {
		cfg.out = filepath.Join(root, cfg.out)
	}
	if !filepath.IsAbs(cfg.profileDir) {
		cfg.profileDir = filepath.Join(root, cfg.profileDir)
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rep := newReport(cfg)
	start := time.Now()
	fmt.Fprintln(log, "Starting the embedded control plane and the operator…")
	e, err := startEnv(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	// Watches and client goroutines of the phases end before the control
	// plane stops, so kube-apiserver shuts down promptly.
	ctx, cancel := context.WithCancel(ctx)
	defer e.stop()
	defer cancel()
	if cfg.dumpMetrics {
		defer e.dumpMetrics(context.WithoutCancel(ctx), filepath.Dir(cfg.out))
	}
	rep.Env.Operator = e.op.Describe()
	fmt.Fprintf(log, "Ready in %.1fs (%s).\n", time.Since(start).Seconds(), rep.Env.Operator)
	phase := func(name string, f func() error) error {
		if !cfg.runs(name) || ctx.Err() != nil {
			return ctx.Err()
		}
		t := time.Now()
		fmt.Fprintf(log, "== %s\n", name)
		var stopProfiles func()
		// scale profiles each size's measurements, throughput each run
		if cfg.profilePhase == name && name != "scale" && name != "throughput" {
			stopProfiles = e.startProfiles(ctx, cfg, name, log)
		}
		err := f()
		if stopProfiles != nil {
			stopProfiles()
		}
		rep.Durations[name] = time.Since(t).Round(time.Millisecond).String()
		fmt.Fprintf(log, "   %s done in %s\n", name, time.Since(t).Round(time.Millisecond))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	for _, p := range []struct {
		name string
		f    func() error
	}{
		{"micro", func() error {
			if cfg.quick {
				benchTime(100 * time.Millisecond)
			}
			return rep.micro()
		}},
		{"handoff", func() error { return rep.handoff(ctx, e, cfg, log) }},
		{"expiry", func() error { return rep.expiry(ctx, e, cfg) }},
		{"throughput", func() error { return rep.throughput(ctx, e, cfg, log) }},
		{"webhook", func() error { return rep.webhook(ctx, e, cfg, log) }},
		{"scale", func() error { return rep.scale(ctx, e, cfg, log) }},
		{"nontarget", func() error { return rep.nontarget(ctx, e, cfg, log) }},
		{soakPhase, func() error { return rep.soak(ctx, e, cfg, log) }},
	} {
		if err := phase(p.name, p.f); err != nil {
			rep.finish(start)
			return rep, err
		}
	}
	rep.finish(start)
	return rep, nil
}
