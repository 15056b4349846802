// Package fencectl is the kubectl fence plugin: platform teams and auditors
// take, renew and release locks, inspect the registry, write protected objects
// under a held grant, read receipt logs and audit what is protected.
// cmd/kubectl-fence runs it; tests run it in-process against the real API server.
package fencectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// exitError carries a non-zero exit code whose explanation was already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Run executes the plugin with args (without the program name) and returns
// its exit code. The connection comes from kubectl's flags and kubeconfig
// files (--kubeconfig, --context, -n, --as, --request-timeout, …).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newRoot(stdout, stderr)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	var exit exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.code
	default:
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
}

// options are the flags every command shares.
type options struct {
	stdout, stderr io.Writer
	// flags are kubectl's connection flags, read as kubectl reads them.
	flags *genericclioptions.ConfigFlags
	// print are kubectl's output flags; format is their parsed value.
	print  *genericclioptions.PrintFlags
	format format
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	o := &options{stdout: stdout, stderr: stderr, flags: genericclioptions.NewConfigFlags(true), print: newPrintFlags()}
	root := &cobra.Command{
		Use:               "fence",
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl fence"},
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Short:             "Fenced locks: take, renew and release grants, write protected objects, inspect and audit",
		Long: `kubectl fence works with fencekeeper's registry (FencedResources) and grants (LockGrants).

A grant is permission to attempt; the protected write is checked by the
acceptance webhook against the grant's signature and fence token. A stale
owner's write is refused with STALE_OWNER.

The connection flags (--kubeconfig, --context, -n, --as, --as-group,
--request-timeout, --server, …) and the output flags (-o json|yaml|name|
wide|jsonpath=…|go-template=…) are kubectl's. See docs/kubectl-fence.md.`,
		Example: `  # Take a lock, write the protected object under it, release it
  kubectl fence acquire invoice-batch-2026-07-19 -n billing --request-id nightly-42
  kubectl fence write invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing -f batch.yaml
  kubectl fence release invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing

  # What is held, queued or in trouble, cluster-wide
  kubectl fence status -A`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.checkOutput(cmd)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	o.flags.AddFlags(root.PersistentFlags())
	o.registerFlagCompletions(root)
	root.AddCommand(o.acquireCmd(), o.renewCmd(), o.releaseCmd(), o.statusCmd(), o.writeCmd(), o.deleteCmd(), o.receiptsCmd(), o.auditCmd(),
		o.versionCmd(), completionCmd(root, stdout), o.keysCmd(), o.pgCmd())
	return root
}

// restConfig is the API server connection the flags and kubeconfig describe.
func (o *options) restConfig() (*rest.Config, error) {
	cfg, err := o.flags.ToRESTConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, noKubeconfig(o.flags.ToRawKubeConfigLoader().ConfigAccess())
	}
	if err == nil {
		if err := o.noCluster(); err != nil {
			return nil, err
		}
	}
	if err != nil {
		return nil, fmt.Errorf("no usable kubeconfig (set KUBECONFIG or --kubeconfig; with make dev, run the export line it prints): %w", err)
	}
	return cfg, nil
}

// ns is the namespace the command works in: -n, else the context's, else default.
func (o *options) ns() string {
	if ns, _, err := o.flags.ToRawKubeConfigLoader().Namespace(); err == nil && ns != "" {
		return ns
	}
	return "default"
}

func (o *options) kube() (client.WithWatch, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: locksv1.Scheme})
}

func (o *options) lockClient(ctx context.Context) (*lockclient.Client, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	return lockclient.NewForConfig(ctx, cfg, o.ns())
}

// waitLimit bounds a command's wait (--timeout) by --request-timeout when
// that is shorter: as for kubectl get --watch, the request timeout ends a
// watch. It returns the bound and the flag that set it, for the error.
func (o *options) waitLimit(timeout time.Duration) (time.Duration, string, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return 0, "", err
	}
	if cfg.Timeout > 0 && cfg.Timeout < timeout {
		return cfg.Timeout, "--request-timeout", nil
	}
	return timeout, "--timeout", nil
}

func (o *options) printf(format string, args ...any) { fmt.Fprintf(o.stdout, format, args...) }

// table starts a tab-aligned table with its header.
func (o *options) table(header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(o.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	return tw
}

// until says how far t is from now, for people.
func until(t time.Time) string {
	d := time.Until(t).Round(100 * time.Millisecond)
	if d < 0 {
		return fmt.Sprintf("%s ago", -d)
	}
	return "in " + d.String()
}
