// Package operator assembles the fencekeeper operator: the grant issuer (leader
// only), the admission webhooks (every replica), health probes, metrics and,
// for local control planes, self-managed webhook certificates. cmd/manager runs
// it from flags; the local control plane (make dev, make demo) runs the same
// code in-process.
package operator

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/controllers"
	"github.com/fencekeeper/fencekeeper/internal/certs"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// Options configure one operator process.
type Options struct {
	// Namespace holds the signing key, trust bundle, epoch record and the
	// leader-election lease.
	Namespace string
	// MetricsAddr and ProbeAddr are listen addresses ("0" disables).
	MetricsAddr, ProbeAddr string
	// MetricsInsecure serves metrics over plain HTTP to anyone who can reach
	// the port; by default they are HTTPS and need a token allowed to get /metrics.
	MetricsInsecure bool
	// MetricsCertDir holds tls.crt and tls.key for the metrics endpoint;
	// empty: a self-signed certificate generated at start.
	MetricsCertDir string
	// LeaderElect: only the leader issues; each new leader starts an epoch.
	LeaderElect bool
	// WebhookHost and WebhookPort are where the webhook server listens.
	WebhookHost string
	WebhookPort int
	// CertDir holds tls.crt and tls.key (written there with SelfSignedCerts).
	CertDir string
	// SelfSignedCerts generates a CA and serving certificate for WebhookHosts
	// and patches WebhookConfiguration's caBundle (no cert-manager needed).
	SelfSignedCerts      bool
	WebhookHosts         []string
	WebhookConfiguration string
	// MaxConcurrentReconciles: FencedResources decided in parallel.
	MaxConcurrentReconciles int
	// Clock is the issuer's and the webhook's clock (default: real time).
	Clock clock.Clock
	// OnIssuing, if set, is called once this replica issues grants (it leads)
	// and its webhook server is serving.
	OnIssuing func()
	// DesiredWebhooks, if set, returns WebhookConfiguration's webhooks as
	// installed; otherwise the leader keeps them as it first finds them.
	DesiredWebhooks func(ctx context.Context) ([]admissionregistrationv1.ValidatingWebhook, error)
}

// The metrics endpoint's authentication and authorization filter.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// MetricsOptions configure the metrics endpoint. Secure: HTTPS (HTTP/2 off),
// and every scrape's bearer token is checked by the API server: a TokenReview
// authenticates it and a SubjectAccessReview must allow `get` on the
// non-resource URL /metrics (the metrics-reader ClusterRole grants it). The
// operator therefore needs to create both reviews (RBAC just above).
func MetricsOptions(addr string, secure bool, certDir string) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if secure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.CertDir = certDir
		o.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return o
}

// Run runs the operator against cfg until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	if o.Namespace == "" {
		o.Namespace = locksv1.DefaultNamespace
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	var caBundle []byte
	if o.SelfSignedCerts {
		if o.CertDir == "" {
			o.CertDir = filepath.Join(os.TempDir(), "fencekeeper-webhook-certs")
		}
		b, err := certs.Generate(o.WebhookHosts, 365*24*time.Hour)
		if err == nil {
			err = b.WriteServingFiles(o.CertDir)
		}
		if err != nil {
			return fmt.Errorf("webhook serving certificate: %w", err)
		}
		caBundle = b.CACert
	}
	// HTTP/2 stays off on the webhook server (CVE-2023-44487, rapid reset).
	noHTTP2 := func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        locksv1.Scheme,
		Cache:                         controllers.CacheOptions(o.Namespace),
		Metrics:                       MetricsOptions(o.MetricsAddr, !o.MetricsInsecure, o.MetricsCertDir),
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              locksv1.LeaderElectionID,
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.CertDir, TLSOpts: []func(*tls.Config){noHTTP2},
		}),
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	issuer, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: o.Namespace, Clock: o.Clock, MaxConcurrentReconciles: o.MaxConcurrentReconciles})
	if err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	if err := webhooks.SetupLockGrantWebhook(mgr, o.Namespace); err != nil {
		return fmt.Errorf("LockGrant webhook: %w", err)
	}
	if err := webhooks.SetupFencedResourceWebhook(mgr); err != nil {
		return fmt.Errorf("FencedResource webhook: %w", err)
	}
	if _, err := webhooks.SetupProtectedWebhook(mgr, o.Namespace, o.Clock); err != nil {
		return fmt.Errorf("protected-object webhook: %w", err)
	}
	if caBundle != nil {
		// Uncached: the operator may get and patch this one configuration, not list or watch them.
		uncached, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
		if err != nil {
			return err
		}
		if err := mgr.Add(&webhooks.CABundlePatcher{Client: uncached, Name: o.WebhookConfiguration, CABundle: caBundle}); err != nil {
			return fmt.Errorf("caBundle patcher: %w", err)
		}
	}
	if o.WebhookConfiguration == "" {
		o.WebhookConfiguration = locksv1.WebhookConfigurationName
	}
	if err := SetupAdmissionGuard(mgr, GuardOptions{
		Namespace: o.Namespace, WebhookConfiguration: o.WebhookConfiguration, CABundle: caBundle, DesiredWebhooks: o.DesiredWebhooks,
	}); err != nil {
		return fmt.Errorf("admission guard: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	if o.OnIssuing != nil {
		started := mgr.GetWebhookServer().StartedChecker()
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			if err := issuer.Wait(ctx); err != nil {
				return nil // stopped before leading
			}
			for started(nil) != nil {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(20 * time.Millisecond):
				}
			}
			o.OnIssuing()
			return nil
		})); err != nil {
			return err
		}
	}
	mgr.GetLogger().Info("starting operator", "namespace", o.Namespace, "leaderElect", o.LeaderElect)
	return mgr.Start(ctx)
}
