package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/operator"
)

// DeploymentName is the manager Deployment of config/default and the chart.
const DeploymentName = "fencekeeper-controller-manager"

// uninstall runs `manager uninstall`: the cleanup of what a manifest or
// chart does not list (operator.Uninstall). The chart's pre-delete hook
// runs it; by hand it is the same as docs/install.md's uninstall steps.
func uninstall(args []string, out io.Writer) int {
	fs := flag.NewFlagSet("manager uninstall", flag.ContinueOnError)
	fs.SetOutput(out)
	var o operator.UninstallOptions
	fs.StringVar(&o.Namespace, "namespace", locksv1.DefaultNamespace, "The operator's namespace.")
	fs.StringVar(&o.Deployment, "deployment", DeploymentName, "The manager Deployment in --namespace, scaled to 0 before anything is removed (empty: do not scale; the operator must be stopped already).")
	fs.StringVar(&o.WebhookConfiguration, "webhook-configuration", locksv1.WebhookConfigurationName, "The ValidatingWebhookConfiguration to delete.")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", 2*time.Minute, "How long to wait for the operator's replicas to stop.")
	fs.Usage = func() {
		_, _ = fmt.Fprintln(out, "Usage: manager uninstall [flags]\n\nDeletes the webhook configuration, stops the operator, then deletes the trust-anchor admission policy and binding, the namespaces' fencekeeper.dev/enrolled labels and the LockGrants' locks.fencekeeper.dev/release finalizers. Safe to run again.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(out, "manager uninstall: unexpected argument %q (it takes flags only)\n", fs.Arg(0))
		return 2
	}
	o.Log = func(format string, a ...any) { _, _ = fmt.Fprintf(out, format+"\n", a...) }
	cfg, err := ctrl.GetConfig()
	if err != nil {
		_, _ = fmt.Fprintf(out, "manager uninstall: %v\n", err)
		return 1
	}
	if err := operator.Uninstall(ctrl.SetupSignalHandler(), cfg, o); err != nil {
		_, _ = fmt.Fprintf(out, "manager uninstall: %v\n", err)
		return 1
	}
	_, _ = fmt.Fprintln(out, "fencekeeper's cluster-wide leftovers are removed")
	return 0
}
