// Command gates prints fencekeeper's release-gate report: it plays many
// seeded schedules of the deterministic simulator (test/sim) and checks every
// release gate (docs/contract.md, "Release gates"). With -seed it replays one schedule and prints
// its trace.
//
//	go run ./test/sim/cmd/gates                      # 100,000 schedules
//	go run ./test/sim/cmd/gates -base-seed=42        # the same run again
//	go run ./test/sim/cmd/gates -seed=4711           # one schedule, traced
//	go run ./test/sim/cmd/gates -seed=717 -store-one-in=-1  # as it played before the store path
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencekeeper/fencekeeper/test/sim"
)

func main() {
	schedules := flag.Int("schedules", 100_000, "number of schedules")
	baseSeed := flag.Uint64("base-seed", 0, "seed of the first schedule (0: derived from the clock, printed)")
	seed := flag.String("seed", "", "replay the schedule with this seed and print its trace")
	parallel := flag.Int("parallel", runtime.GOMAXPROCS(0), "schedules run at once")
	suppress := flag.String("suppress", "", "comma-separated fault numbers drawn but not applied (printed by a minimized failure)")
	storeOneIn := flag.Int("store-one-in", 0, "one schedule in this many has a PostgreSQL store (0: the default, 3; -1: none, as schedules played before the store path)")
	flag.Parse()
	// Many short-lived objects and a small live heap: collect only near 1 GiB.
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(1 << 30)

	cfg := sim.Config{StoreOneIn: *storeOneIn}
	for _, s := range strings.Split(*suppress, ",") {
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= len(sim.AllFaults()) {
			fatalf("-suppress: %q is not a fault number (0..%d)", s, len(sim.AllFaults())-1)
		}
		cfg.Suppress = append(cfg.Suppress, sim.Fault(n))
	}
	if *seed != "" {
		n, err := strconv.ParseUint(*seed, 10, 64)
		if err != nil {
			fatalf("-seed: %v", err)
		}
		os.Exit(replay(n, cfg))
	}
	if *baseSeed == 0 {
		*baseSeed = uint64(time.Now().UnixNano()) % 1_000_000_000_000
	}
	os.Exit(run(*baseSeed, *schedules, *parallel, cfg))
}

func run(base uint64, n, parallel int, cfg sim.Config) int {
	fmt.Printf("fencekeeper release gates: deterministic simulation (test/sim)\n")
	fmt.Printf("reproduce: go run ./test/sim/cmd/gates -schedules=%d -base-seed=%d\n\n", n, base)
	var done atomic.Int64
	stop := make(chan struct{})
	go func() { // progress, every 10 %
		last := int64(0)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
				if d := done.Load(); d*10/int64(n) > last*10/int64(n) {
					fmt.Fprintf(os.Stderr, "  %d/%d schedules\n", d, n)
					last = d
				}
			}
		}
	}()
	rep := sim.Run(base, n, parallel, cfg, &done)
	close(stop)

	fmt.Printf("schedules  %s (seeds %d … %d), %d at a time on %d CPUs, runtime %s\n",
		group(rep.Schedules), base, base+uint64(n)-1, rep.Parallel, runtime.NumCPU(), rep.Elapsed.Round(time.Second))
	fmt.Printf("simulated  %.0f virtual hours, %s scheduler steps, %s grants issued, %s writes decided by the acceptance point, %s faults injected\n\n",
		rep.VirtualTime.Hours(), group(rep.Steps), group(rep.GrantsIssued), group(rep.Attempts), group(sum(rep.Faults[:])))
	fmt.Println(rep.GateTable())
	fmt.Println(rep.FaultMatrix())
	fmt.Printf("all verdicts: %s\n\n", rep.VerdictSummary())
	fmt.Printf("%s\n\n", rep.StoreSummary())
	fmt.Println(rep.StoreFaultMatrix())

	if rep.Passed() {
		fmt.Printf("RESULT: PASS. Every gate holds over %s schedules. Replay any one: go run ./test/sim/cmd/gates -seed=<seed>\n", group(rep.Schedules))
		return 0
	}
	fmt.Printf("RESULT: FAIL. %d schedule(s) broke a rule; the first:\n", rep.FailedCount)
	for _, r := range rep.Failed {
		fmt.Println("  " + strings.ReplaceAll(r.Describe(), "\n", "\n  "))
	}
	if len(rep.Failed) > 0 {
		first := rep.Failed[0].Seed
		fmt.Printf("\nminimal trace of seed %d:\n", first)
		printMinimal(first, cfg)
	}
	return 1
}

// replay plays one schedule with its trace; a failing one is minimized.
func replay(seed uint64, cfg sim.Config) int {
	cfg.Trace = true
	res := sim.RunSchedule(seed, cfg)
	for _, l := range res.Trace {
		fmt.Println(l)
	}
	fmt.Println()
	fmt.Println(res.Describe())
	if !res.Failed() {
		return 0
	}
	fmt.Printf("\nminimal trace of seed %d:\n", seed)
	printMinimal(seed, cfg)
	return 1
}

func printMinimal(seed uint64, cfg sim.Config) {
	cfg.Trace = false
	res, suppressed := sim.Minimize(seed, cfg)
	for _, l := range res.Trace {
		fmt.Println(l)
	}
	nums := make([]string, len(suppressed))
	for i, f := range suppressed {
		nums[i] = strconv.Itoa(int(f))
	}
	fmt.Println(res.Describe())
	fmt.Printf("reproduce: go run ./test/sim/cmd/gates -seed=%d -suppress=%s\n", seed, strings.Join(nums, ","))
}

func sum(xs []int64) int64 {
	var n int64
	for _, x := range xs {
		n += x
	}
	return n
}

func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gates: "+format+"\n", args...)
	os.Exit(2)
}
