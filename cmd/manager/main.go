// Command manager runs the fencekeeper operator: the grant issuer (leader
// only) and the admission webhooks (every replica).
package main

import (
	"flag"
	"os"
	"strings"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/internal/operator"
)

func main() {
	var o operator.Options
	var webhookHosts string
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint (0 disables it).")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&o.LeaderElect, "leader-elect", true, "Elect a leader; only the leader issues grants, and each new leader starts a new issuer epoch.")
	flag.StringVar(&o.Namespace, "namespace", locksv1.DefaultNamespace, "Namespace of the signing key, trust bundle, epoch record and leader-election lease.")
	flag.StringVar(&o.CertDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key for the webhook server (default: controller-runtime's).")
	flag.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", 4, "FencedResources decided in parallel (one resource is never decided twice at once).")
	flag.BoolVar(&o.SelfSignedCerts, "self-signed-certs", false, "Generate the webhook serving certificate and patch the webhook configuration's caBundle (local control planes without cert-manager).")
	flag.StringVar(&webhookHosts, "webhook-hosts", "localhost,127.0.0.1", "With --self-signed-certs: comma-separated host names and IPs of the serving certificate.")
	flag.StringVar(&o.WebhookConfiguration, "webhook-configuration", locksv1.WebhookConfigurationName, "With --self-signed-certs: the ValidatingWebhookConfiguration whose caBundle is patched.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	o.WebhookHosts = strings.Split(webhookHosts, ",")

	if err := operator.Run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o); err != nil {
		ctrl.Log.WithName("setup").Error(err, "operator stopped with an error")
		os.Exit(1)
	}
}
