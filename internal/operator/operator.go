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
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// Options configure one operator process.
type Options struct {
	// Namespace holds the signing key, trust bundle, epoch record and the
	// leader-election lease.
	Namespace string
	// MetricsAddr and ProbeAddr are listen addresses ("0" disables).
	MetricsAddr, ProbeAddr string
	// PprofAddr serves net/http/pprof for memory and CPU profiles of a
	// live replica ("" or "0": off). Bind it to loopback and reach it with
	// kubectl port-forward: profiles show cached objects.
	PprofAddr string
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
	// CertDir holds tls.crt and tls.key (unused with SelfSignedCerts).
	CertDir string
	// SelfSignedCerts serves a CA and serving certificate for WebhookHosts
	// kept in the Secret CertSecret, shared by all replicas and rotated
	// before expiry, and patches WebhookConfiguration's caBundle (no
	// cert-manager needed).
	SelfSignedCerts      bool
	WebhookHosts         []string
	WebhookConfiguration string
	// CertSecret (default certs.DefaultSecretName) and CertSyncInterval
	// (default 1m: how soon a replica serves a renewed certificate).
	CertSecret       string
	CertSyncInterval time.Duration
	// CertPolicy overrides certs.DefaultPolicy (tests use short validities).
	CertPolicy *certs.Policy
	// CertManagerUsername is the user cert-manager writes the webhook
	// certificate Secret locksv1.CertManagerCertSecret as, which the
	// operator-namespace policy lets do so; empty: only the operator may.
	CertManagerUsername string
	// MaxConcurrentReconciles: FencedResources decided in parallel.
	MaxConcurrentReconciles int
	// EndedGrantRetention: how long ended LockGrants are kept (0: the
	// default, negative: forever).
	EndedGrantRetention time.Duration
	// EndedGrantMaxCount: how many ended LockGrants are kept at most, the
	// oldest beyond it deleted before their retention (0: the default,
	// negative: no bound by count).
	EndedGrantMaxCount int
	// Clock is the issuer's and the webhook's clock (default: real time).
	Clock clock.Clock
	// OnIssuing, if set, is called once this replica issues grants (it leads)
	// and its webhook server is serving.
	OnIssuing func()
	// DesiredWebhooks, if set, returns WebhookConfiguration's webhooks as
	// installed; otherwise the leader keeps them as it first finds them.
	DesiredWebhooks func(ctx context.Context) ([]admissionregistrationv1.ValidatingWebhook, error)
	// ProtectedKinds are the declared protected kinds (--protected-kinds).
	ProtectedKinds []schema.GroupVersionResource
	// ExemptNamespaces are never enrolled besides kube-system, kube-public
	// and Namespace (--exempt-namespaces, validated by enrollment.ParseExtra).
	ExemptNamespaces []string
	// RegistryReadFromCache breaks a safety rule on purpose: the acceptance
	// webhook reads the registry from the informer cache instead of the API
	// server. Only test/chaos sets it (cmd/manager built with -tags chaos),
	// to show that its checker finds the stale writes this lets through.
	RegistryReadFromCache bool
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
	rotator, err := newRotator(ctx, cfg, o)
	if err != nil {
		return err
	}
	versions := controllers.NewCreationVersions()
	mgr, err := newManager(cfg, o, rotator, versions)
	if err != nil {
		return err
	}
	exempt := enrollment.NewExemptions(o.Namespace, o.ExemptNamespaces)
	identity, err := controllers.Setup(ctx, mgr, controllers.Options{
		Namespace: o.Namespace, Clock: o.Clock, MaxConcurrentReconciles: o.MaxConcurrentReconciles, EndedGrantRetention: o.EndedGrantRetention,
		EndedGrantMaxCount: o.EndedGrantMaxCount, Exempt: exempt, CreationVersions: versions,
	})
	if err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	if o.WebhookConfiguration == "" {
		o.WebhookConfiguration = locksv1.WebhookConfigurationName
	}
	if err := setupWebhooks(mgr, o, exempt); err != nil {
		return err
	}
	caBundle, err := addRotator(mgr, rotator)
	if err != nil {
		return err
	}
	if err := SetupAdmissionGuard(mgr, GuardOptions{
		Namespace: o.Namespace, WebhookConfiguration: o.WebhookConfiguration, CABundle: caBundle, DesiredWebhooks: o.DesiredWebhooks, ProtectedKinds: o.ProtectedKinds,
		CertSecret: o.CertSecret, CertManagerUsername: o.CertManagerUsername, ExemptNamespaces: exempt.Names(),
	}); err != nil {
		return fmt.Errorf("admission guard: %w", err)
	}
	if err := addProbes(mgr); err != nil {
		return err
	}
	if err := addOnIssuing(mgr, identity, o.OnIssuing); err != nil {
		return err
	}
	mgr.GetLogger().Info("starting operator", "namespace", o.Namespace, "leaderElect", o.LeaderElect)
	return mgr.Start(ctx)
}

// newManager returns the manager: its cache (which keeps the LockGrants'
// versions in versions), metrics, probes, leader election and webhook
// server, which serves the rotator's certificate when there is one.
func newManager(cfg *rest.Config, o Options, rotator *certs.Rotator, versions *controllers.CreationVersions) (manager.Manager, error) {
	// HTTP/2 stays off on the webhook server (CVE-2023-44487, rapid reset).
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	if rotator != nil {
		// Served from the shared Secret, reloaded without restart (no cert dir watch).
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.GetCertificate = rotator.GetCertificate })
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        locksv1.Scheme,
		Cache:                         controllers.CacheOptions(o.Namespace, versions),
		Metrics:                       MetricsOptions(o.MetricsAddr, !o.MetricsInsecure, o.MetricsCertDir),
		HealthProbeBindAddress:        o.ProbeAddr,
		PprofBindAddress:              o.PprofAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              locksv1.LeaderElectionID,
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.CertDir, TLSOpts: tlsOpts,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	return mgr, nil
}

// setupWebhooks registers the LockGrant, FencedResource and protected-object
// webhooks; with RegistryReadFromCache the last reads the registry from the
// cache.
func setupWebhooks(mgr manager.Manager, o Options, exempt enrollment.Exemptions) error {
	if err := webhooks.SetupLockGrantWebhook(mgr, o.Namespace); err != nil {
		return fmt.Errorf("LockGrant webhook: %w", err)
	}
	if err := webhooks.SetupFencedResourceWebhook(mgr, o.WebhookConfiguration, o.Namespace, exempt); err != nil {
		return fmt.Errorf("FencedResource webhook: %w", err)
	}
	protected, err := webhooks.SetupProtectedWebhook(mgr, o.Namespace, o.Clock)
	if err != nil {
		return fmt.Errorf("protected-object webhook: %w", err)
	}
	if o.RegistryReadFromCache {
		protected.Reader = mgr.GetClient()
	}
	return nil
}

// addRotator runs the certificate rotator, if any, with the manager and
// returns its CA bundle (nil without a rotator).
func addRotator(mgr manager.Manager, rotator *certs.Rotator) (func() []byte, error) {
	if rotator == nil {
		return nil, nil
	}
	if err := mgr.Add(rotator); err != nil {
		return nil, fmt.Errorf("certificate rotator: %w", err)
	}
	return rotator.CABundle, nil
}

// addProbes adds the liveness check and the readiness check, ready once the
// webhook server serves.
func addProbes(mgr manager.Manager) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker())
}

// addOnIssuing, if onIssuing is set, calls it once this replica issues
// grants (it leads) and its webhook server is serving.
func addOnIssuing(mgr manager.Manager, identity *controllers.IssuerIdentity, onIssuing func()) error {
	if onIssuing == nil {
		return nil
	}
	started := mgr.GetWebhookServer().StartedChecker()
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if err := identity.Wait(ctx); err != nil {
			return nil // stopped before leading
		}
		for started(nil) != nil {
			if ctxtime.Sleep(ctx, 20*time.Millisecond) != nil {
				return nil
			}
		}
		onIssuing()
		return nil
	}))
}

// newRotator returns the shared-Secret certificate rotator with
// SelfSignedCerts (nil otherwise), after its first sync: the webhook server
// then starts with the certificate every replica serves.
func newRotator(ctx context.Context, cfg *rest.Config, o Options) (*certs.Rotator, error) {
	if !o.SelfSignedCerts {
		return nil, nil
	}
	if o.CertSecret == "" {
		o.CertSecret = certs.DefaultSecretName
	}
	if o.CertSyncInterval <= 0 {
		o.CertSyncInterval = time.Minute
	}
	policy := certs.DefaultPolicy(o.CertSyncInterval)
	if o.CertPolicy != nil {
		policy = *o.CertPolicy
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	// Uncached: RBAC allows this one Secret and configuration by name only.
	c, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return nil, err
	}
	r := &certs.Rotator{
		Client: c, Namespace: o.Namespace, Name: o.CertSecret, Hosts: o.WebhookHosts,
		Policy: policy, Interval: o.CertSyncInterval, WebhookConfiguration: o.WebhookConfiguration,
	}
	if r.WebhookConfiguration == "" {
		r.WebhookConfiguration = locksv1.WebhookConfigurationName
	}
	// The configuration may not be installed yet: serve anyway, Start patches it later.
	if err := r.Sync(ctx); err != nil && r.CABundle() == nil {
		return nil, fmt.Errorf("webhook serving certificate from Secret %s/%s: %w", o.Namespace, o.CertSecret, err)
	}
	return r, nil
}
