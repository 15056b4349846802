// Package fencectl is the kubectl fence plugin: platform teams and auditors
// take, renew and release locks, inspect the registry, write protected objects
// under a held grant, read receipt logs and audit what is protected.
// cmd/kubectl-fence runs it; tests run it in-process against the real API server.
package fencectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// exitError carries a non-zero exit code whose explanation was already printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Run executes the plugin with args (without the program name) and returns
// its exit code. With a nil config the kubeconfig flags and files decide, as
// for kubectl.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, config *rest.Config) int {
	cmd := newRoot(stdout, stderr, config)
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
	config         *rest.Config
	kubeconfig     clientcmd.ClientConfig
	overrides      clientcmd.ConfigOverrides
	loading        *clientcmd.ClientConfigLoadingRules
	namespace      string
	output         string
}

func newRoot(stdout, stderr io.Writer, config *rest.Config) *cobra.Command {
	o := &options{stdout: stdout, stderr: stderr, config: config, loading: clientcmd.NewDefaultClientConfigLoadingRules()}
	root := &cobra.Command{
		Use:               "fence",
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl fence"},
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		Short:             "Fenced locks: take, renew and release grants, write protected objects, inspect and audit",
		Long: `kubectl fence works with fencekeeper's registry (FencedResources) and grants (LockGrants).

A grant is permission to attempt; the protected write is checked by the
acceptance webhook against the grant's signature and fence token. A stale
owner's write is refused with STALE_OWNER.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			grantCmd := cmd.Name() == "acquire" || cmd.Name() == "renew" || cmd.Name() == "release"
			switch {
			case o.output == "" || o.output == "json":
			case o.output == "name" && grantCmd:
			case o.output == "name":
				return fmt.Errorf("-o name prints a LockGrant name: only acquire, renew and release have one (use -o json)")
			default:
				return fmt.Errorf("unknown output format %q: use -o json, -o name (acquire, renew, release), or leave -o out for text", o.output)
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	f := root.PersistentFlags()
	f.StringVar(&o.loading.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file.")
	f.StringVar(&o.overrides.CurrentContext, "context", "", "The kubeconfig context to use.")
	f.StringVarP(&o.namespace, "namespace", "n", "", "Namespace of the FencedResources and LockGrants (default: the context's).")
	f.StringVarP(&o.output, "output", "o", "", "Output format: json, or name (the LockGrant name: acquire, renew, release); default text.")
	o.kubeconfig = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(o.loading, &o.overrides)
	root.AddCommand(o.acquireCmd(), o.renewCmd(), o.releaseCmd(), o.statusCmd(), o.writeCmd(), o.deleteCmd(), o.receiptsCmd(), o.auditCmd(), o.versionCmd())
	return root
}

// restConfig is the API server connection: the given one, or the kubeconfig's.
func (o *options) restConfig() (*rest.Config, error) {
	if o.config != nil {
		return rest.CopyConfig(o.config), nil
	}
	cfg, err := o.kubeconfig.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no usable kubeconfig (set KUBECONFIG or --kubeconfig; with make dev, run the export line it prints): %w", err)
	}
	return cfg, nil
}

// ns is the namespace the command works in.
func (o *options) ns() string {
	if o.namespace != "" {
		return o.namespace
	}
	if o.config == nil {
		if ns, _, err := o.kubeconfig.Namespace(); err == nil && ns != "" {
			return ns
		}
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

// json prints v as indented JSON.
func (o *options) json(v any) error {
	enc := json.NewEncoder(o.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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
