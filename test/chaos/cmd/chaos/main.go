// Command chaos runs fencekeeper's failure matrix on a replicated control
// plane (test/chaos, docs/chaos.md): three etcd members, two kube-apiservers,
// two operators and the workers, each in its own network namespace, under a
// seeded nemesis; then an independent checker reads everything back.
//
//	go run ./test/chaos/cmd/chaos                     # the standard set (make chaos)
//	go run ./test/chaos/cmd/chaos -seed=1042 -schedules=1   # replay one seed
//
// It needs root (ip netns, veth, tc) and bin/k8s (make control-plane). The
// subcommands front and worker are the processes it starts in the namespaces.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/test/chaos"
	"github.com/fencekeeper/fencekeeper/test/internal/front"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "front":
			os.Exit(runFront(os.Args[2:]))
		case "worker":
			os.Exit(runWorker(os.Args[2:]))
		}
	}
	os.Exit(runChaos())
}

func runChaos() int {
	ctrl.SetLogger(logr.Discard())
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	seed := fs.Uint64("seed", 0, "seed of the first schedule (0: derived from the clock, printed)")
	schedules := fs.Int("schedules", 6, "schedules to play (each on its own namespace, on one control plane)")
	length := fs.Duration("length", 75*time.Second, "length of each schedule's fault phase")
	workers := fs.Int("workers", 5, "worker processes (the last two are adversaries, one per API server)")
	broken := fs.String("broken", "", "turn a safety rule off to show what the checker finds: cached-registry-read, unprotected-store-table")
	faults := fs.String("faults", "", "comma-separated faults to draw from (default all): etcd-member, etcd-majority, leader, api-etcd, replica-api, kill, pause, leader-pause, degrade, skew, store-operators, store-workers, store-kill")
	netID := fs.Int("net", 0, "subnet 10.77.<net>.0/24 (0: from the process ID)")
	keep := fs.Bool("keep", false, "keep the work directory (logs, event logs, etcd data)")
	_ = fs.Parse(os.Args[1:])
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%1_000_000) + 1
	}
	if *netID == 0 {
		*netID = os.Getpid()%200 + 20
	}
	cfg := chaos.Config{Seed: *seed, Schedules: *schedules, Length: *length, Workers: *workers, NetID: *netID, Out: os.Stdout}
	var err error
	if cfg.Faults, err = chaos.FaultKinds(*faults); err != nil {
		fmt.Fprintln(os.Stderr, "-faults:", err)
		return 2
	}
	switch *broken {
	case "":
	case "cached-registry-read":
		cfg.Broken.CachedRegistryRead = true
	case "unprotected-store-table":
		cfg.Broken.UnprotectedStoreTable = true
	default:
		fmt.Fprintf(os.Stderr, "-broken=%q: want cached-registry-read or unprotected-store-table\n", *broken)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var report *chaos.Report
	err = prepare(ctx, &cfg)
	if err == nil {
		report, err = chaos.Run(ctx, cfg)
	}
	if !*keep {
		_ = os.RemoveAll(cfg.Dir)
	} else {
		fmt.Println("work directory kept:", cfg.Dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	fmt.Printf("replay with: make chaos SEED=%d CHAOS_SCHEDULES=%d\n", cfg.Seed, cfg.Schedules)
	if report.Total() > 0 {
		return 1
	}
	return 0
}

// prepare finds the repository and bin/k8s and builds the manager (with the
// chaos flags) into a fresh work directory.
func prepare(ctx context.Context, cfg *chaos.Config) error {
	root, err := localcp.RepoRoot()
	if err != nil {
		return err
	}
	cfg.Root = root
	if cfg.Dir, err = os.MkdirTemp("", "fencekeeper-chaos-"); err != nil {
		return err
	}
	cfg.Bins.Assets = os.Getenv("KUBEBUILDER_ASSETS")
	if cfg.Bins.Assets == "" {
		cfg.Bins.Assets = filepath.Join(root, "bin", "k8s")
	}
	if cfg.Bins.Self, err = os.Executable(); err != nil {
		return err
	}
	cfg.Bins.Manager = filepath.Join(cfg.Dir, "manager")
	build := exec.CommandContext(ctx, "go", "build", "-tags", "chaos", "-o", cfg.Bins.Manager, "./cmd/manager")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build -tags chaos ./cmd/manager: %v\n%s", err, out)
	}
	return nil
}

func runFront(args []string) int {
	fs := flag.NewFlagSet("front", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:9443", "address to serve")
	backends := fs.String("backends", "", "comma-separated host:port of the operator replicas")
	_ = fs.Parse(args)
	f, err := front.Listen(*listen, strings.Split(*backends, ","), time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "front:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	f.Close()
	return 0
}

func runWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	var o chaos.WorkerOptions
	var resources string
	fs.StringVar(&o.Name, "name", "worker", "worker name (its event lines say it)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the worker's user and API server")
	fs.StringVar(&o.Namespace, "namespace", "", "namespace of the FencedResources")
	fs.StringVar(&resources, "resources", "", "comma-separated FencedResource names")
	fs.StringVar(&o.Events, "events", "", "event log to append to")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the worker's choices")
	fs.BoolVar(&o.Adversary, "adversary", false, "also write with ended grants and replay envelopes")
	fs.StringVar(&o.StoreDSN, "store-dsn", "", "the workers' role's DSN of the PostgreSQL store (empty: no store commits)")
	_ = fs.Parse(args)
	o.Resources = strings.Split(resources, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := chaos.RunWorker(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}
