// Command manager runs the fencekeeper operator: the grant issuer (leader
// only) and the admission webhooks (every replica).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"

	uberzap "go.uber.org/zap"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/lazylog"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
	"github.com/fencekeeper/fencekeeper/internal/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "uninstall" {
		os.Exit(uninstall(os.Args[2:], os.Stdout))
	}
	var o operator.Options
	var webhookHosts string
	var showVersion bool
	var memoryLimit int64
	var memoryLimitRatio float64
	flag.BoolVar(&showVersion, "version", false, "Print the version and exit.")
	flag.Int64Var(&memoryLimit, "memory-limit", 0, "The container's memory limit in bytes (the Deployment passes limits.memory through the downward API); the Go heap limit becomes --memory-limit-ratio of it unless GOMEMLIMIT is set. 0 leaves Go's default.")
	flag.Float64Var(&memoryLimitRatio, "memory-limit-ratio", 0.9, "Share of --memory-limit the Go runtime aims to stay under (0 < ratio <= 1); the rest is headroom for non-heap memory.")
	var metricsSecure bool
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8443", "Address of the Prometheus metrics endpoint (0 disables it).")
	flag.BoolVar(&metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS and only to callers whose token may get the non-resource URL /metrics (TokenReview and SubjectAccessReview); false serves plain HTTP to anyone.")
	flag.StringVar(&o.MetricsCertDir, "metrics-cert-dir", "", "With --metrics-secure: directory with tls.crt and tls.key for the metrics endpoint (default: a self-signed certificate generated at start).")
	flag.StringVar(&o.PprofAddr, "pprof-bind-address", "", "Address of net/http/pprof (empty or 0: off). Profiles hold cached objects: bind to loopback (127.0.0.1:6060) and use kubectl port-forward.")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&o.LeaderElect, "leader-elect", true, "Elect a leader; only the leader issues grants, and each new leader starts a new issuer epoch.")
	flag.StringVar(&o.Namespace, "namespace", locksv1.DefaultNamespace, "Namespace of the signing key, trust bundle, epoch record and leader-election lease.")
	flag.StringVar(&o.CertDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key for the webhook server (default: controller-runtime's).")
	flag.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", 4, "FencedResources decided in parallel (one resource is never decided twice at once).")
	flag.DurationVar(&o.EndedGrantRetention, "ended-grant-retention", controllers.DefaultEndedGrantRetention, "How long a LockGrant is kept after it ended (Released, Expired, Revoked, Denied) before the operator deletes it; one recording an unresolved write is kept until that is resolved. Negative: never delete (--ended-grant-max-count then bounds nothing either).")
	flag.IntVar(&o.EndedGrantMaxCount, "ended-grant-max-count", controllers.DefaultEndedGrantMaxCount, "How many ended LockGrants are kept at most, however recent: the oldest beyond it are deleted before --ended-grant-retention, so that frequent acquisitions cannot fill etcd. Those recording an unresolved write are neither counted nor deleted. 0: the default; negative: no bound by count.")
	flag.BoolVar(&o.SelfSignedCerts, "self-signed-certs", false, "Serve a self-signed webhook certificate shared by all replicas through one Secret (--webhook-cert-secret), rotated before expiry, and patch the webhook configuration's caBundle (clusters without cert-manager).")
	flag.StringVar(&o.CertSecret, "webhook-cert-secret", locksv1.SelfSignedCertSecret, "With --self-signed-certs: the Secret in --namespace holding the shared CA and serving certificate (the operator's Role names it; only the operator may write it).")
	flag.StringVar(&o.CertManagerUsername, "cert-manager-username", locksv1.CertManagerUsername, "The user cert-manager writes the webhook certificate Secret "+locksv1.CertManagerCertSecret+" in --namespace as: the operator-namespace admission policy lets it, and the operator, write that Secret and nobody else. Empty: only the operator (installs without cert-manager).")
	flag.DurationVar(&o.CertSyncInterval, "webhook-cert-sync-interval", time.Minute, "With --self-signed-certs: how often each replica re-reads the Secret (reloads a renewed certificate, renews a due one).")
	flag.StringVar(&webhookHosts, "webhook-hosts", "localhost,127.0.0.1", "With --self-signed-certs: comma-separated host names and IPs of the serving certificate.")
	flag.StringVar(&o.WebhookConfiguration, "webhook-configuration", locksv1.WebhookConfigurationName, "With --self-signed-certs: the ValidatingWebhookConfiguration whose caBundle is patched.")
	var protectedKinds string
	flag.StringVar(&protectedKinds, "protected-kinds", "", "Comma-separated kinds the protected-object webhook checks besides ConfigMaps, as <resource>.<group>/<version> (<resource>/<version> for the core group), e.g. widgets.example.com/v1. The operator keeps the webhook rules in step; the installer grants it get on each (docs/protecting-objects.md).")
	var exemptNamespaces string
	flag.StringVar(&exemptNamespaces, "exempt-namespaces", "", "Comma-separated namespaces that are never enrolled, besides kube-system, kube-public and --namespace, which always are: no FencedResource may be created there and the acceptance webhook never sees their writes, so they never wait on the operator (docs/security.md).")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	applyChaosFlags(&o)
	if showVersion {
		fmt.Println("manager", version.String())
		return
	}
	// Reconciles and admission requests each get a logger with their own
	// fields; lazylog encodes them only for an entry that is written.
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts), zap.RawZapOpts(uberzap.WrapCore(lazylog.Wrap))))
	setup := ctrl.Log.WithName("setup")
	setup.Info("fencekeeper manager", "version", version.Get().Version, "commit", version.Get().Commit)
	_, envSet := os.LookupEnv("GOMEMLIMIT")
	heap, err := goMemLimit(memoryLimit, memoryLimitRatio, envSet)
	if err != nil {
		setup.Error(err, "invalid memory limit flags")
		os.Exit(2)
	}
	if heap > 0 {
		debug.SetMemoryLimit(heap)
		setup.Info("Go memory limit set", "bytes", heap, "containerLimit", memoryLimit, "ratio", memoryLimitRatio)
	}
	o.WebhookHosts = strings.Split(webhookHosts, ",")
	if o.ProtectedKinds, err = protectedkinds.Parse(protectedKinds); err != nil {
		setup.Error(err, "invalid --protected-kinds")
		os.Exit(2)
	}
	if o.ExemptNamespaces, err = enrollment.ParseExtra(exemptNamespaces); err != nil {
		setup.Error(err, "invalid --exempt-namespaces")
		os.Exit(2)
	}
	o.MetricsInsecure = !metricsSecure

	if err := operator.Run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o); err != nil {
		setup.Error(err, "operator stopped with an error")
		os.Exit(1)
	}
}

// applyChaosFlags applies the fault-injection flags of a binary built with
// -tags chaos (chaos.go, for test/chaos only); a release binary has none.
var applyChaosFlags = func(*operator.Options) {}

// goMemLimit is the Go heap limit for a container memory limit: ratio of it,
// leaving headroom below the OOM kill for stacks and non-Go memory. It is 0
// (keep Go's setting) when no limit is known or GOMEMLIMIT was set explicitly.
func goMemLimit(limit int64, ratio float64, envSet bool) (int64, error) {
	if ratio <= 0 || ratio > 1 {
		return 0, fmt.Errorf("--memory-limit-ratio=%v: want 0 < ratio <= 1", ratio)
	}
	if limit < 0 {
		return 0, fmt.Errorf("--memory-limit=%d: want a byte count >= 0", limit)
	}
	if limit == 0 || envSet {
		return 0, nil
	}
	return int64(float64(limit) * ratio), nil
}
