// Command dev runs fencekeeper's local development environment (make dev): the
// embedded control plane (etcd, kube-apiserver and kube-controller-manager's
// namespace and garbage-collector controllers, from bin/k8s), the CRDs,
// webhook configuration and RBAC of an installation, and the operator with
// self-managed webhook certificates. It writes kubeconfigs, prints how to use
// them, and runs until interrupted; then it stops every process it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
)

func main() {
	var (
		dir, metricsAddr, kinds string
		verbose, bare           bool
	)
	flag.StringVar(&dir, "dir", "bin/dev", "Where the kubeconfigs are written.")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "The operator's Prometheus metrics endpoint (0 disables it).")
	flag.BoolVar(&verbose, "v", false, "Print the operator's logs.")
	flag.BoolVar(&bare, "bare", false, "Start an empty cluster without fencekeeper, to install it as a release would (README, docs/install.md).")
	flag.StringVar(&kinds, "protected-kinds", "", "Custom kinds the operator protects besides ConfigMaps, as <resource>.<group>/<version>,… (make dev PROTECTED_KINDS=…; docs/protecting-objects.md).")
	flag.Parse()
	protected, err := protectedkinds.Parse(kinds)
	if err != nil {
		err = fmt.Errorf("PROTECTED_KINDS (-protected-kinds): %w", err)
	} else if bare && len(protected) > 0 {
		err = errors.New("-bare starts no operator, so -protected-kinds (PROTECTED_KINDS) has nothing to declare them to: give one or the other")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(2)
	}
	log := logr.Discard()
	if verbose {
		log = zap.New(zap.UseDevMode(true))
	}
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, dir, metricsAddr, bare, protected); err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, metricsAddr string, bare bool, kinds []schema.GroupVersionResource) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	fmt.Println("Starting etcd, kube-apiserver and kube-controller-manager…")
	cp, err := localcp.Start(ctx, localcp.Options{Bare: bare, ControllerManager: true, ProtectedKinds: kinds})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Println("Stopping kube-controller-manager, kube-apiserver and etcd…")
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the control plane:", err)
		}
	}()
	running := "fencekeeper is running: the operator issues grants and its webhooks guard protected objects (ConfigMaps" +
		declared(kinds) + ").\nMetrics: http://" + metricsAddr + "/metrics"
	if bare {
		running = "An empty cluster is running (no fencekeeper): install it as the README's \"Install in a cluster\" says.\n" +
			"It has no nodes: run the manager yourself and publish its address in an EndpointSlice of the webhook Service (test/install does)."
	} else {
		fmt.Println("Starting the operator (self-signed webhook certificates)…")
		// Loopback only, as printed below: plain HTTP.
		op, err := cp.RunOperator(ctx, operator.Options{MetricsAddr: metricsAddr, MetricsInsecure: true})
		if err != nil {
			return err
		}
		defer func() {
			fmt.Println("Stopping the operator…")
			if err := op.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stop the operator:", err)
			}
		}()
	}
	if err := writeKubeconfigs(cp, dir); err != nil {
		return err
	}
	defer func() {
		for _, k := range kubeconfigs {
			_ = os.Remove(filepath.Join(dir, k.file))
		}
	}()
	fmt.Printf(`
%s

export KUBECONFIG=%s
export PATH=%s:$PATH   # kubectl fence (make dev builds bin/kubectl-fence)

Workers (group %s) have their own kubeconfigs:
  %s
  %s
Press Ctrl-C to stop; everything started here stops with it.
`, running, filepath.Join(dir, "kubeconfig"), filepath.Join(cp.Root(), "bin"), localcp.WorkersGroup,
		filepath.Join(dir, "worker-a.kubeconfig"), filepath.Join(dir, "worker-b.kubeconfig"))
	<-ctx.Done()
	fmt.Println()
	return nil
}

// declared names the declared custom kinds for the banner.
func declared(kinds []schema.GroupVersionResource) string {
	if len(kinds) == 0 {
		return "; make dev PROTECTED_KINDS=<resource>.<group>/<version> declares custom kinds"
	}
	return ", " + strings.ReplaceAll(protectedkinds.FormatList(kinds), ",", ", ")
}

// kubeconfigs are the users whose kubeconfigs are written, in order: the
// admin's last, so that a script waiting for it finds the others too.
var kubeconfigs = []struct{ user, group, file string }{
	{"worker-a", localcp.WorkersGroup, "worker-a.kubeconfig"},
	{"worker-b", localcp.WorkersGroup, "worker-b.kubeconfig"},
	{"dev-admin", "system:masters", "kubeconfig"},
}

// writeKubeconfigs writes a kubeconfig per user into dir, each atomically.
func writeKubeconfigs(cp *localcp.ControlPlane, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, k := range kubeconfigs {
		u, err := cp.AddUser(k.user, k.group)
		if err != nil {
			return err
		}
		data, err := u.KubeConfig()
		if err != nil {
			return err
		}
		path := filepath.Join(dir, k.file)
		if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return err
		}
	}
	return nil
}
