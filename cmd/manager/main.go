// Command manager runs the fencekeeper operator: the grant issuer (leader
// only) and the admission webhooks (every replica).
package main

import (
	"crypto/tls"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/pkg/certs"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

func main() {
	var (
		metricsAddr, probeAddr, namespace, certDir string
		leaderElect, selfSignedCerts               bool
		webhookPort, concurrency                   int
		webhookHosts, webhookConfig                string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint (0 disables it).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader; only the leader issues grants, and each new leader starts a new issuer epoch.")
	flag.StringVar(&namespace, "namespace", controllers.DefaultNamespace, "Namespace of the signing key, trust bundle, epoch record and leader-election lease.")
	flag.StringVar(&certDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key for the webhook server (default: controller-runtime's).")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.IntVar(&concurrency, "max-concurrent-reconciles", 4, "FencedResources decided in parallel (one resource is never decided twice at once).")
	flag.BoolVar(&selfSignedCerts, "self-signed-certs", false, "Generate the webhook serving certificate and patch the webhook configuration's caBundle (local control planes without cert-manager).")
	flag.StringVar(&webhookHosts, "webhook-hosts", "localhost,127.0.0.1", "With --self-signed-certs: comma-separated host names and IPs of the serving certificate.")
	flag.StringVar(&webhookConfig, "webhook-configuration", "fencekeeper-validating-webhook-configuration", "With --self-signed-certs: the ValidatingWebhookConfiguration whose caBundle is patched.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(locksv1.AddToScheme(scheme))

	var caBundle []byte
	if selfSignedCerts {
		if certDir == "" {
			certDir = filepath.Join(os.TempDir(), "fencekeeper-webhook-certs")
		}
		b, err := certs.Generate(strings.Split(webhookHosts, ","), 365*24*time.Hour)
		if err == nil {
			err = b.WriteServingFiles(certDir)
		}
		if err != nil {
			log.Error(err, "unable to make the webhook serving certificate")
			os.Exit(1)
		}
		caBundle = b.CACert
	}
	noHTTP2 := func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controllers.CacheOptions(namespace),
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        probeAddr,
		LeaderElection:                leaderElect,
		LeaderElectionID:              "issuer.locks.fencekeeper.dev",
		LeaderElectionNamespace:       namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: webhook.NewServer(webhook.Options{
			Port: webhookPort, CertDir: certDir, TLSOpts: []func(*tls.Config){noHTTP2},
		}),
	})
	if err != nil {
		log.Error(err, "unable to create manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: namespace, MaxConcurrentReconciles: concurrency}); err != nil {
		log.Error(err, "unable to set up the issuer")
		os.Exit(1)
	}
	if err := webhooks.SetupLockGrantWebhook(mgr); err != nil {
		log.Error(err, "unable to set up the LockGrant webhook")
		os.Exit(1)
	}
	if err := webhooks.SetupFencedResourceWebhook(mgr); err != nil {
		log.Error(err, "unable to set up the FencedResource webhook")
		os.Exit(1)
	}
	if _, err := webhooks.SetupProtectedWebhook(mgr, namespace, clock.RealClock{}); err != nil {
		log.Error(err, "unable to set up the protected-object webhook")
		os.Exit(1)
	}
	if caBundle != nil {
		if err := mgr.Add(&webhooks.CABundlePatcher{Client: mgr.GetClient(), Name: webhookConfig, CABundle: caBundle}); err != nil {
			log.Error(err, "unable to set up the caBundle patcher")
			os.Exit(1)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to set up the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		log.Error(err, "unable to set up the readiness check")
		os.Exit(1)
	}
	log.Info("starting manager", "namespace", namespace, "leaderElect", leaderElect)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped with an error")
		os.Exit(1)
	}
}
