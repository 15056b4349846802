package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
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
	pctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	// The API server's and the child operator's profile endpoints need their
	// duration up front: take consecutive 10 s profiles of each until the
	// phase ends, then merge each with go tool pprof.
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; pctx.Err() == nil; i++ {
				raw, err := take(pctx)
				if err != nil {
					if pctx.Err() == nil {
						fmt.Fprintf(log, "   %s profile: %v\n", name, err)
					}
					return
				}
				path := filepath.Join(cfg.profileDir, fmt.Sprintf("%s-%s-%02d.pprof", phase, name, i))
				_ = os.WriteFile(path, raw, 0o644)
			}
		}()
	}
	var self *os.File
	if cfg.inProcess && cfg.cpuProfile == "" {
		f, err := os.Create(filepath.Join(cfg.profileDir, phase+"-bench-and-operator.pprof"))
		if err == nil && pprof.StartCPUProfile(f) == nil {
			self = f
		}
	}
	return func() {
		if self != nil {
			pprof.StopCPUProfile()
			self.Close()
		}
		// Let the API server's current window finish so its profile covers the phase's end.
		if rest := 10*time.Second - time.Since(start)%(10*time.Second); rest > 0 && rest < 10*time.Second {
			time.Sleep(rest + 500*time.Millisecond)
		}
		cancel()
		wg.Wait()
		fmt.Fprintf(log, "   profiles of %s in %s (merge: go tool pprof -top %s)\n", phase, cfg.profileDir,
			filepath.Join(cfg.profileDir, phase+"-{kube-apiserver,operator}-*.pprof"))
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

// heapProfile writes this process's heap profile (with -in-process it holds
// the operator's informer caches).
func (e *env) heapProfile(cfg *config, label string, log io.Writer) {
	if !cfg.inProcess {
		return
	}
	if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
		return
	}
	runtime.GC()
	f, err := os.Create(filepath.Join(cfg.profileDir, label+"-heap.pprof"))
	if err != nil {
		fmt.Fprintf(log, "   heap profile: %v\n", err)
		return
	}
	defer f.Close()
	_ = pprof.WriteHeapProfile(f)
}

// benchTime shortens testing.Benchmark's run time (quick mode).
func benchTime(d time.Duration) {
	testing.Init()
	_ = flag.Set("test.benchtime", d.String())
}
