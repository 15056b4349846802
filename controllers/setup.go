package controllers

import (
	"context"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options configure the issuing controllers.
type Options struct {
	// Namespace holds the signing key, trust bundle and epoch record.
	Namespace string
	// Clock is the issuer's clock; every expiry is judged by it.
	Clock clock.Clock
	// InstanceName, when set, suffixes controller names so several issuers can
	// share one process (tests that race two issuers).
	InstanceName string
	// MaxConcurrentReconciles bounds how many FencedResources are decided at once.
	MaxConcurrentReconciles int
	// Identity, when set, is shared instead of creating one: a second controller
	// with its own cache then decides under the same signing key and epoch
	// (tests race two such controllers on one resource).
	Identity *IssuerIdentity
	// EndedGrantRetention is how long an ended LockGrant is kept before it is
	// deleted (0: DefaultEndedGrantRetention; negative: never, whatever
	// EndedGrantMaxCount says).
	EndedGrantRetention time.Duration
	// EndedGrantMaxCount bounds how many ended LockGrants are kept: the
	// oldest beyond it are deleted before their retention (0:
	// DefaultEndedGrantMaxCount; negative: no bound by count).
	EndedGrantMaxCount int
	// WrapClient, when set, wraps the issuing controller's client; tests use it
	// to inject faults such as a crash between two writes.
	WrapClient func(client.Client) client.Client
	// Exempt are the namespaces never enrolled (the zero value: kube-system
	// and kube-public).
	Exempt enrollment.Exemptions
	// CreationVersions are the LockGrants' versions as the manager's cache
	// first received them (the memory given to CacheOptions): FIFO within
	// a second. Nil: requests created in one second are served by name.
	CreationVersions *CreationVersions
}

// Setup adds the issuer (its identity and controllers) to mgr and returns its identity.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) (*IssuerIdentity, error) {
	if o.Namespace == "" {
		o.Namespace = locksv1.DefaultNamespace
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	name := func(base string) string {
		if o.InstanceName == "" {
			return ""
		}
		return base + "-" + o.InstanceName
	}
	identity := o.Identity
	if identity == nil {
		identity = NewIssuerIdentity(mgr.GetClient(), mgr.GetAPIReader(), o.Namespace, o.Clock, mgr.GetLogger().WithName("issuer"))
		if err := mgr.Add(identity); err != nil {
			return nil, err
		}
	}
	c := mgr.GetClient()
	if o.WrapClient != nil {
		c = o.WrapClient(c)
	}
	if err := (&IssuerReconciler{
		Client: c, APIReader: mgr.GetAPIReader(), Identity: identity,
		Recorder: mgr.GetEventRecorder("fencekeeper-issuer"), Name: name("grant-issuer"),
		MaxConcurrentReconciles: o.MaxConcurrentReconciles, CreationVersions: o.CreationVersions,
	}).SetupWithManager(ctx, mgr); err != nil {
		return nil, err
	}
	if err := (&UnresolvedMutationReconciler{
		Client: mgr.GetClient(), Identity: identity, Recorder: mgr.GetEventRecorder("fencekeeper-issuer"), Name: name("unresolved-mutations"),
	}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := setupCollector(ctx, mgr, o); err != nil {
		return nil, err
	}
	if err := (&NamespaceEnrollmentReconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Name: name("namespace-enrollment"),
		Exempt: o.Exempt, Recorder: mgr.GetEventRecorder("fencekeeper-enrollment")}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&TrustBundleReconciler{Client: mgr.GetClient(), Identity: identity, Name: name("trust-bundle")}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := (&StorePublisher{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Identity: identity,
		Recorder: mgr.GetEventRecorder("fencekeeper-stores"), Name: name("store-publisher")}).SetupWithManager(mgr); err != nil {
		return nil, err
	}
	return identity, nil
}

// setupCollector adds the ended-LockGrant collector unless the retention is
// negative (never delete).
func setupCollector(ctx context.Context, mgr ctrl.Manager, o Options) error {
	if o.EndedGrantRetention == 0 {
		o.EndedGrantRetention = DefaultEndedGrantRetention
	}
	if o.EndedGrantMaxCount == 0 {
		o.EndedGrantMaxCount = DefaultEndedGrantMaxCount
	}
	if o.EndedGrantRetention < 0 {
		return nil
	}
	return (&EndedGrantCollector{Client: mgr.GetClient(), Clock: o.Clock, Retention: o.EndedGrantRetention,
		MaxCount: o.EndedGrantMaxCount}).SetupWithManager(ctx, mgr)
}
