package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

// startProfiles captures CPU profiles while one phase runs: kube-apiserver's
// (its /debug/pprof/profile, through the admin client), the operator's (its
// --pprof-bind-address) when it is a child process, and, with -in-process,
// this process's (operator + bench clients, told apart by package). The returned
// function stops them and writes the files.
func (e *env) startProfiles(ctx context.Context, cfg *config, phase string, log io.Writer) func() {
	if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
		fmt.Fprintf(log, "   profiles: %v\n", err)
		return func() {}
	}
	// The API server's and the child operator's profile endpoints need their
	// duration up front: take consecutive 10 s profiles of each until the
	// phase ends (the window in progress then finishes, so the profiles
	// cover the phase's end), then merge each with go tool pprof.
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	sources := map[string]func(context.Context) ([]byte, error){
		"kube-apiserver": func(ctx context.Context) ([]byte, error) {
			return e.adminC.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "10").DoRaw(ctx)
		},
	}
	if !cfg.inProcess {
		sources["operator"] = func(ctx context.Context) ([]byte, error) { return e.op.CPUProfile(ctx, 10*time.Second) }
	}
	var wg sync.WaitGroup
	for name, take := range sources {
		prefix := phase + "-" + name
		first := e.profileWindows(cfg, prefix)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := first; !stopped(); i++ {
				raw, err := takeProfile(ctx, take)
				if err != nil {
					if ctx.Err() == nil {
						fmt.Fprintf(log, "   %s profile: %v\n", name, err)
					}
					return
				}
				_ = os.WriteFile(filepath.Join(cfg.profileDir, fmt.Sprintf("%s-%02d.pprof", prefix, i)), raw, 0o644)
				e.mu.Lock()
				e.profiled[prefix] = i + 1
				e.mu.Unlock()
			}
		}()
	}
	var self *os.File
	if cfg.inProcess && cfg.cpuProfile == "" {
		prefix := phase + "-bench-and-operator"
		i := e.profileWindows(cfg, prefix)
		f, err := os.Create(filepath.Join(cfg.profileDir, fmt.Sprintf("%s-%02d.pprof", prefix, i)))
		if err == nil && pprof.StartCPUProfile(f) == nil {
			self = f
			e.mu.Lock()
			e.profiled[prefix] = i + 1
			e.mu.Unlock()
		}
	}
	return func() {
		if self != nil {
			pprof.StopCPUProfile()
			self.Close()
		}
		close(stop)
		wg.Wait()
		fmt.Fprintf(log, "   profiles of %s in %s (merge: go tool pprof -top %s)\n", phase, cfg.profileDir,
			filepath.Join(cfg.profileDir, phase+"-{kube-apiserver,operator}-*.pprof"))
	}
}

// profileWindows is the number of the next window of prefix's profiles. A
// phase profiled again in the same run (each throughput repetition) adds
// windows; the first use in a run removes what an earlier run left under
// that prefix, so a merge of prefix-*.pprof is one run's.
func (e *env) profileWindows(cfg *config, prefix string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.profiled == nil {
		e.profiled = map[string]int{}
	}
	if n, ok := e.profiled[prefix]; ok {
		return n
	}
	e.profiled[prefix] = 0
	stale, _ := filepath.Glob(filepath.Join(cfg.profileDir, prefix+"-[0-9][0-9].pprof"))
	for _, f := range stale {
		_ = os.Remove(f)
	}
	return 0
}

// takeProfile takes one profile window, again after a moment when the
// source refuses: its previous window, cancelled when the last phase
// ended, may still be closing (Go's pprof handler allows one at a time).
func takeProfile(ctx context.Context, take func(context.Context) ([]byte, error)) ([]byte, error) {
	for attempt := 1; ; attempt++ {
		raw, err := take(ctx)
		if err == nil || attempt == 4 || ctx.Err() != nil {
			return raw, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// profiling starts the profiles of one run of phase, labelled label, when
// -profile-phase names it; the returned function stops them (a no-op
// otherwise). The throughput phase profiles each of its runs on its own, so
// the floor's and fencekeeper's API server work can be compared.
func (e *env) profiling(ctx context.Context, cfg *config, phase, label string, log io.Writer) func() {
	if cfg.profilePhase != phase {
		return func() {}
	}
	return e.startProfiles(ctx, cfg, label, log)
}

// heapProfiles writes what holds the memory of kube-apiserver (its
// /debug/pprof/heap, after a collection) and of the operator (its pprof
// endpoint; with -in-process, this process's, the bench's clients included),
// as label-heap-{kube-apiserver,operator}.pprof (outside the CPU windows'
// label-{kube-apiserver,operator}-*.pprof, which the bench says to merge).
func (e *env) heapProfiles(ctx context.Context, cfg *config, label string, log io.Writer) {
	if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
		fmt.Fprintf(log, "   heap profiles: %v\n", err)
		return
	}
	sources := map[string]func(context.Context) ([]byte, error){
		"kube-apiserver": func(ctx context.Context) ([]byte, error) {
			return e.adminC.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/heap").Param("gc", "1").DoRaw(ctx)
		},
		"operator": e.op.HeapProfile,
	}
	for name, take := range sources {
		raw, err := take(ctx)
		if err == nil {
			err = os.WriteFile(filepath.Join(cfg.profileDir, label+"-heap-"+name+".pprof"), raw, 0o644)
		}
		if err != nil {
			fmt.Fprintf(log, "   %s heap profile: %v\n", name, err)
		}
	}
}

// benchTime shortens testing.Benchmark's run time (quick mode).
func benchTime(d time.Duration) {
	testing.Init()
	_ = flag.Set("test.benchtime", d.String())
}
