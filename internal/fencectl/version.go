package fencectl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/version"
)

// operatorVersionTimeout bounds the lookup of the operator's version: the
// client's version is printed whatever the cluster does.
const operatorVersionTimeout = 5 * time.Second

// versionDoc is kubectl fence version's document, shaped like kubectl
// version's (clientVersion, then the server side).
type versionDoc struct {
	ClientVersion   version.Info     `json:"clientVersion"`
	OperatorVersion *operatorVersion `json:"operatorVersion,omitempty"`
}

// operatorVersion is what the operator's replicas report of their build.
// Every replica serves the webhooks and renews its verifier Lease
// (fencekeeper-verifier-<replica>) every 2 s, annotated with its
// internal/version; so the live Leases say which builds are running now.
type operatorVersion struct {
	// Version and Commit are set when every live replica runs the same build.
	Version string `json:"version,omitempty"`
	Commit  string `json:"commit,omitempty"`
	// Unknown says why Version is empty.
	Unknown  string           `json:"unknown,omitempty"`
	Replicas []replicaVersion `json:"replicas,omitempty"`
}

type replicaVersion struct {
	Replica   string    `json:"replica"`
	Version   string    `json:"version,omitempty"` // empty: the replica's build reports none
	Commit    string    `json:"commit,omitempty"`
	Live      bool      `json:"live"`
	RenewedAt time.Time `json:"renewedAt,omitzero"`
}

func (o *options) versionCmd() *cobra.Command {
	var (
		clientOnly bool
		opNS       string
	)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the kubectl fence version and the running operator's",
		Long: `version prints the plugin's version and the version of the fencekeeper
operator in --operator-namespace. Each operator replica reports its build on
its verifier Lease there (annotations fencekeeper.dev/version and
fencekeeper.dev/commit, renewed every 2 s); the versions of the live ones
are printed, each one when they differ (a rollout under way). Reading them
needs list on leases in that namespace. When the operator's version cannot
be told, it is printed as unknown with the reason, and the command still
succeeds. --client prints the plugin's version only, without contacting
the cluster.`,
		Example: `  # The plugin's and the operator's versions
  kubectl fence version

  # The plugin's only, without a cluster
  kubectl fence version --client

  # The operator installed in another namespace, as JSON
  kubectl fence version --operator-namespace fencekeeper -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc := versionDoc{ClientVersion: version.Get()}
			if !clientOnly {
				ov := o.operatorVersion(cmd.Context(), opNS)
				doc.OperatorVersion = &ov
			}
			return o.emit(doc, nil, func(bool) error {
				o.printVersion(doc, opNS)
				return nil
			})
		},
	}
	o.addOutputFlags(cmd)
	cmd.Flags().BoolVar(&clientOnly, "client", false, "Print the plugin's version only, without contacting the cluster.")
	o.operatorNamespaceFlag(cmd, &opNS)
	return cmd
}

// operatorVersion reads the verifier Leases in ns. It never fails: what
// went wrong is the version's Unknown.
func (o *options) operatorVersion(ctx context.Context, ns string) operatorVersion {
	limit, _, err := o.waitLimit(operatorVersionTimeout)
	if err != nil {
		return operatorVersion{Unknown: unknownBecause(err, ns, limit)}
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cfg, err := o.restConfig()
	if err != nil {
		return operatorVersion{Unknown: unknownBecause(err, ns, limit)}
	}
	// Discovery, too, must not outlast the limit (a black-holed API server).
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = limit
	kube, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return operatorVersion{Unknown: unknownBecause(err, ns, limit)}
	}
	var leases coordinationv1.LeaseList
	if err := kube.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{locksv1.LabelComponent: locksv1.ComponentVerifier}); err != nil {
		return operatorVersion{Unknown: unknownBecause(err, ns, limit)}
	}
	return operatorVersionOf(leases.Items, ns, time.Now())
}

// unknownBecause is the reason for an unknown operator version, in one line.
func unknownBecause(err error, ns string, limit time.Duration) string {
	switch {
	case errors.Is(err, errNoKubeconfig) && strings.Contains(err.Error(), "\n"):
		// The whole hint is for commands that need the cluster.
		return "no kubeconfig found: set KUBECONFIG or --kubeconfig"
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("your user may not list Leases in %s, where the operator's replicas report their version", ns)
	case errors.Is(err, context.DeadlineExceeded):
		return "the API server did not answer within " + limit.String()
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

// operatorVersionOf reads the builds the verifier Leases report; now decides
// which replicas are live.
func operatorVersionOf(leases []coordinationv1.Lease, ns string, now time.Time) operatorVersion {
	var v operatorVersion
	builds := map[[2]string][]string{} // live replicas by (version, commit)
	for i := range leases {
		l := &leases[i]
		if !strings.HasPrefix(l.Name, locksv1.VerifierLeasePrefix) {
			continue
		}
		r := locksv1.ParseVerifierLease(l, now)
		rv := replicaVersion{Replica: r.Replica, Version: l.Annotations[locksv1.AnnotationVersion],
			Commit: l.Annotations[locksv1.AnnotationCommit], Live: r.Live}
		if l.Spec.RenewTime != nil {
			rv.RenewedAt = l.Spec.RenewTime.Time
		}
		v.Replicas = append(v.Replicas, rv)
		if rv.Live {
			key := [2]string{rv.Version, rv.Commit}
			builds[key] = append(builds[key], rv.Replica)
		}
	}
	sort.Slice(v.Replicas, func(i, j int) bool { return v.Replicas[i].Replica < v.Replicas[j].Replica })
	switch {
	case len(v.Replicas) == 0:
		v.Unknown = fmt.Sprintf("no operator replica reports in namespace %s: is fencekeeper installed there? (--operator-namespace)", ns)
	case len(builds) == 0:
		v.Unknown = fmt.Sprintf("no operator replica in %s has reported in the last seconds: is it running? (kubectl get pods -n %s)", ns, ns)
	case len(builds) > 1:
		v.Unknown = fmt.Sprintf("the live replicas run %d different builds (a rollout under way?)", len(builds))
	default:
		for build := range builds {
			v.Version, v.Commit = build[0], build[1]
		}
		if v.Version == "" {
			v.Unknown = "the operator's build does not report its version (older than this plugin's version reporting)"
		}
	}
	return v
}

func (o *options) printVersion(doc versionDoc, ns string) {
	o.printf("Client Version: %s\n", doc.ClientVersion)
	ov := doc.OperatorVersion
	if ov == nil {
		return
	}
	live := 0
	for _, r := range ov.Replicas {
		if r.Live {
			live++
		}
	}
	if ov.Version != "" {
		o.printf("Operator Version: %s (commit %s; %d live replica(s) in %s)\n", ov.Version, ov.Commit, live, ns)
		return
	}
	o.printf("Operator Version: unknown (%s)\n", ov.Unknown)
	if len(ov.Replicas) > 0 {
		tw := o.table("  REPLICA", "LIVE", "VERSION", "COMMIT", "RENEWED")
		for _, r := range ov.Replicas {
			fmt.Fprintf(tw, "  %s\t%t\t%s\t%s\t%s\n", r.Replica, r.Live, orNone(r.Version), orNone(r.Commit), until(r.RenewedAt))
		}
		_ = tw.Flush()
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
