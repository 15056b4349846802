package operator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
)

// The guard may read, watch and write back its own webhook configuration,
// policy and binding by name only. Creating the policy and binding cannot be
// limited by name in RBAC; a policy can only deny, never grant.
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;list;watch;update,resourceNames=fencekeeper-validating-webhook-configuration
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=get;list;watch;update,resourceNames=fencekeeper-trust-anchors
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,verbs=create
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=selfsubjectreviews,verbs=create

const (
	// AggregateToManagerLabel marks a ClusterRole whose rules the API server
	// aggregates into the operator's protected-kinds role
	// (config/rbac/protected_kinds_role.yaml): the installer's per-kind read access.
	AggregateToManagerLabel = "fencekeeper.dev/aggregate-to-manager"
	// guardResync re-checks everything now and then, in case a watch event was missed.
	guardResync = 5 * time.Minute
)

var (
	webhookConfigurationRestored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_webhook_configuration_restored_total",
		Help: "Times the operator wrote its webhook configuration back to the installed shape after a drift."})
	trustAnchorPolicyRestored = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_trust_anchor_policy_restored_total",
		Help: "Times the operator restored its trust-anchor admission policy or binding after a change or deletion."})
)

func init() {
	metrics.Registry.MustRegister(webhookConfigurationRestored, trustAnchorPolicyRestored)
}

// GuardOptions configure the admission guard.
type GuardOptions struct {
	// Namespace is the operator namespace: its trust anchors are guarded.
	Namespace string
	// WebhookConfiguration is the ValidatingWebhookConfiguration kept as installed.
	WebhookConfiguration string
	// CABundle, when set, returns the caBundle the operator manages
	// (self-signed certificates, rotated); it is then restored too.
	// Otherwise the caBundle belongs to whoever injects it (cert-manager)
	// and is left alone.
	CABundle func() []byte
	// DesiredWebhooks, when set, returns the webhooks to keep. When nil,
	// they are this version's own (ShapeWebhooks), pointed where the live
	// configuration points the first time the guard runs as leader.
	DesiredWebhooks func(ctx context.Context) ([]admissionregistrationv1.ValidatingWebhook, error)
	// ShapeGeneration is the generation of the shape this operator keeps
	// (0: WebhookShapeGeneration); tests run an older operator with a lower one.
	ShapeGeneration int
	// ExemptNamespaces are excluded from the protected entries by
	// namespaceSelector (enrollment.Exemptions.Names).
	ExemptNamespaces []string
	// ProtectedKinds are the declared protected kinds (--protected-kinds):
	// the protected entries' rules are the built-in ConfigMaps rules plus one
	// rule per kind, and nothing else.
	ProtectedKinds []schema.GroupVersionResource
	// CertSecret is the Secret of the operator's own webhook certificate
	// (--webhook-cert-secret; empty: locksv1.SelfSignedCertSecret).
	CertSecret string
	// CertManagerUsername is the user cert-manager writes
	// locksv1.CertManagerCertSecret as; empty: only the operator may.
	CertManagerUsername string
}

// AdmissionGuard keeps the admission machinery that protects fencekeeper as
// installed: the trust-anchor policy and binding (created on first start) and
// the webhook configuration (failurePolicy, selectors, rules, caBundle, ...).
// It runs on the leader only, so that two replicas never fight over what
// "installed" means (e.g. during a rolling upgrade); a standby takes over
// within one lease duration.
type AdmissionGuard struct {
	opts     GuardOptions
	client   client.Client // uncached: RBAC allows these objects by name only
	recorder events.EventRecorder

	mu           sync.Mutex
	operatorUser string
	desired      []admissionregistrationv1.ValidatingWebhook
	policySeen   bool
	bindingSeen  bool
	// yieldedTo is the newer generation this replica last left the
	// configuration to (reported once per generation).
	yieldedTo int
}

// SetupAdmissionGuard adds the guard to mgr: a cache that watches exactly its
// three objects by name (field selector metadata.name, so RBAC by resourceName
// suffices) and a leader-only controller that restores them.
func SetupAdmissionGuard(mgr ctrl.Manager, o GuardOptions) error {
	if o.Namespace == "" || o.WebhookConfiguration == "" {
		return errors.New("admission guard: Namespace and WebhookConfiguration are required")
	}
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return err
	}
	byName := func(name string) cache.ByObject {
		return cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", name)}
	}
	watched, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&admissionregistrationv1.ValidatingWebhookConfiguration{}:   byName(o.WebhookConfiguration),
			&admissionregistrationv1.ValidatingAdmissionPolicy{}:        byName(TrustAnchorPolicyName),
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{}: byName(TrustAnchorPolicyName),
		},
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(watched); err != nil {
		return err
	}
	g := &AdmissionGuard{opts: o, client: c, recorder: mgr.GetEventRecorder("fencekeeper-admission-guard")}
	// Every change to any of the three objects checks all of them.
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.WebhookConfiguration}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("admission-guard").
		// Tests run more than one operator per process.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		WatchesRawSource(source.Kind[client.Object](watched, &admissionregistrationv1.ValidatingWebhookConfiguration{}, one)).
		WatchesRawSource(source.Kind[client.Object](watched, &admissionregistrationv1.ValidatingAdmissionPolicy{}, one)).
		WatchesRawSource(source.Kind[client.Object](watched, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}, one)).
		Complete(g)
}

// Reconcile restores the policy, the binding and the webhook configuration.
func (g *AdmissionGuard) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	user, err := g.identity(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	policy, binding := TrustAnchorPolicy(AnchorScope{
		Namespace: g.opts.Namespace, Operator: user, CertSecret: g.opts.CertSecret, CertManager: g.opts.CertManagerUsername,
	})
	if err := g.ensurePolicy(ctx, policy); err != nil {
		return ctrl.Result{}, err
	}
	if err := g.ensureBinding(ctx, binding); err != nil {
		return ctrl.Result{}, err
	}
	if err := g.restoreWebhooks(ctx); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: guardResync}, nil
}

// identity asks the API server who the operator is (a SelfSubjectReview), so
// the policy names the identity the operator really writes with, whatever
// namespace or service account it was installed under.
func (g *AdmissionGuard) identity(ctx context.Context) (string, error) {
	if g.operatorUser != "" {
		return g.operatorUser, nil
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := g.client.Create(ctx, review); err != nil {
		return "", fmt.Errorf("who am I (SelfSubjectReview): %w", err)
	}
	if review.Status.UserInfo.Username == "" {
		return "", errors.New("who am I (SelfSubjectReview): the API server returned no user name")
	}
	g.operatorUser = review.Status.UserInfo.Username
	ctrl.LoggerFrom(ctx).Info("guarding trust anchors for the operator identity", "user", g.operatorUser)
	return g.operatorUser, nil
}

func (g *AdmissionGuard) ensurePolicy(ctx context.Context, want *admissionregistrationv1.ValidatingAdmissionPolicy) error {
	var got admissionregistrationv1.ValidatingAdmissionPolicy
	return g.ensure(ctx, want, &got, "ValidatingAdmissionPolicy", "policy", &g.policySeen, func() bool {
		if !PolicyDrifted(want.Spec, got.Spec) {
			return false
		}
		got.Spec = want.Spec
		return true
	})
}

func (g *AdmissionGuard) ensureBinding(ctx context.Context, want *admissionregistrationv1.ValidatingAdmissionPolicyBinding) error {
	var got admissionregistrationv1.ValidatingAdmissionPolicyBinding
	return g.ensure(ctx, want, &got, "ValidatingAdmissionPolicyBinding", "binding", &g.bindingSeen, func() bool {
		if !BindingDrifted(want.Spec, got.Spec) {
			return false
		}
		got.Spec = want.Spec
		return true
	})
}

// ensure keeps one trust-anchor object as installed: it creates want when
// it is absent, and when restore finds the stored got drifted (and puts
// want's spec into it) it writes got back.
func (g *AdmissionGuard) ensure(ctx context.Context, want, got client.Object, kind, what string, seen *bool, restore func() bool) error {
	err := g.client.Get(ctx, client.ObjectKeyFromObject(want), got)
	switch {
	case apierrors.IsNotFound(err):
		if err := g.client.Create(ctx, want.DeepCopyObject().(client.Object)); err != nil {
			return fmt.Errorf("create %s %s: %w", kind, want.GetName(), err)
		}
		g.created(ctx, want, *seen, what)
	case err != nil:
		return fmt.Errorf("read %s %s: %w", kind, want.GetName(), err)
	case restore():
		if err := g.client.Update(ctx, got); err != nil {
			return fmt.Errorf("restore %s %s: %w", kind, want.GetName(), err)
		}
		g.restoredPolicy(ctx, got, "changed")
	}
	*seen = true
	return nil
}

// created logs a first installation, and reports a re-creation after this
// operator had seen the object (someone deleted it) as drift.
func (g *AdmissionGuard) created(ctx context.Context, obj client.Object, seenBefore bool, what string) {
	if !seenBefore {
		ctrl.LoggerFrom(ctx).Info("installed the trust-anchor admission "+what, "name", obj.GetName())
		return
	}
	g.restoredPolicy(ctx, obj, "deleted")
}

func (g *AdmissionGuard) restoredPolicy(ctx context.Context, obj client.Object, how string) {
	trustAnchorPolicyRestored.Inc()
	kind := fmt.Sprintf("%T", obj)[len("*v1."):]
	ctrl.LoggerFrom(ctx).Info("restored the trust-anchor admission policy", "kind", kind, "name", obj.GetName(), "was", how)
	g.recorder.Eventf(obj, nil, corev1.EventTypeWarning, locksv1.EventReasonTrustAnchorPolicyDrift, "Restore",
		"%s %s was %s; restored as installed by the operator", kind, obj.GetName(), how)
}

// restoreWebhooks writes this operator's webhooks back when the live ones
// drifted, and rewrites a configuration of an older shape generation to its
// own (an upgrade). It leaves a configuration of a newer generation alone:
// that is the shape of a newer operator, and this one is on its way out.
func (g *AdmissionGuard) restoreWebhooks(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx)
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := g.client.Get(ctx, types.NamespacedName{Name: g.opts.WebhookConfiguration}, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			// Re-creating it would need cluster-wide create on webhook
			// configurations; a deleted configuration is an uninstall, loudly logged.
			log.Error(err, "the webhook configuration is gone: protected writes are not checked", "name", g.opts.WebhookConfiguration)
			return nil
		}
		return fmt.Errorf("read ValidatingWebhookConfiguration %s: %w", g.opts.WebhookConfiguration, err)
	}
	own := g.generation()
	live, genErr := ShapeGeneration(&cfg)
	if live > own {
		g.yield(ctx, &cfg, live, own)
		return nil
	}
	desired, err := g.desiredWebhooks(ctx, &cfg)
	if err != nil {
		return err
	}
	restored, drift := WebhookDrift(desired, cfg.Webhooks, g.opts.CABundle != nil)
	if cfg.Annotations == nil {
		cfg.Annotations = map[string]string{}
	}
	declared := protectedkinds.FormatList(g.opts.ProtectedKinds)
	if v, ok := cfg.Annotations[locksv1.AnnotationProtectedKinds]; !ok || v != declared {
		cfg.Annotations[locksv1.AnnotationProtectedKinds] = declared
		drift = append(drift, "annotation "+locksv1.AnnotationProtectedKinds)
	}
	adopted := live < own || genErr != nil
	if adopted {
		cfg.Annotations[locksv1.AnnotationWebhookShapeGeneration] = strconv.Itoa(own)
	}
	if drift == nil && !adopted {
		return nil
	}
	if restored != nil {
		cfg.Webhooks = restored
	}
	if err := g.client.Update(ctx, &cfg); err != nil { // resourceVersion precondition: a conflict retries
		return fmt.Errorf("restore ValidatingWebhookConfiguration %s (%s): %w", cfg.Name, strings.Join(drift, ", "), err)
	}
	if adopted {
		// An install or an upgrade, not tampering: no drift metric.
		log.Info("wrote this operator's webhook shape", "name", cfg.Name, "generation", own, "from", live, "changed", drift, "annotation", genErr)
		g.recorder.Eventf(&cfg, nil, corev1.EventTypeNormal, locksv1.EventReasonWebhookConfigurationAdopted, "Adopt",
			"webhook shape generation %d (was %d) written by the operator: %s", own, live, describe(drift))
		return nil
	}
	webhookConfigurationRestored.Inc()
	log.Info("restored the webhook configuration as installed", "name", cfg.Name, "restored", drift)
	g.recorder.Eventf(&cfg, nil, corev1.EventTypeWarning, locksv1.EventReasonWebhookConfigurationDrift, "Restore",
		"restored as installed: %s", strings.Join(drift, ", "))
	return nil
}

// describe lists what a write changed, or says it changed nothing else.
func describe(changes []string) string {
	if len(changes) == 0 {
		return "no webhook changed"
	}
	return strings.Join(changes, ", ")
}

// generation is the shape generation this operator keeps.
func (g *AdmissionGuard) generation() int {
	if g.opts.ShapeGeneration > 0 {
		return g.opts.ShapeGeneration
	}
	return WebhookShapeGeneration
}

// yield leaves a configuration of a newer generation alone, and says so once
// per generation: normally a rollout in progress; if no newer operator runs,
// someone wrote the annotation, and nothing restores the configuration.
func (g *AdmissionGuard) yield(ctx context.Context, cfg *admissionregistrationv1.ValidatingWebhookConfiguration, live, own int) {
	if g.yieldedTo == live {
		return
	}
	g.yieldedTo = live
	ctrl.LoggerFrom(ctx).Info("the webhook configuration has a newer operator's shape: leaving it to that operator",
		"name", cfg.Name, "generation", live, "own", own)
	g.recorder.Eventf(cfg, nil, corev1.EventTypeWarning, locksv1.EventReasonWebhookConfigurationDrift, "Yield",
		"%s names webhook shape generation %d, newer than this operator's %d: left as it is. Expected while a newer operator version rolls out; "+
			"if none runs, roll the operator forward or remove the annotation so that it is restored", locksv1.AnnotationWebhookShapeGeneration, live, own)
}

// desiredWebhooks returns the webhooks this operator keeps: its own shape,
// pointed where the live configuration points the first time, with the
// declared kinds' rules, the exempt namespaces excluded and the managed
// caBundle when there is one.
func (g *AdmissionGuard) desiredWebhooks(ctx context.Context, live *admissionregistrationv1.ValidatingWebhookConfiguration) ([]admissionregistrationv1.ValidatingWebhook, error) {
	if g.desired == nil {
		hooks, err := g.shape(ctx, live)
		if err != nil {
			return nil, fmt.Errorf("webhooks of %s: %w", g.opts.WebhookConfiguration, err)
		}
		if len(hooks) == 0 {
			return nil, fmt.Errorf("webhook configuration %s has no webhooks to keep", g.opts.WebhookConfiguration)
		}
		ctrl.LoggerFrom(ctx).Info("keeping the webhook configuration", "name", g.opts.WebhookConfiguration, "webhooks", len(hooks),
			"generation", g.generation(), "protectedKinds", protectedkinds.FormatList(g.opts.ProtectedKinds), "exemptNamespaces", g.opts.ExemptNamespaces)
		hooks = WithProtectedKinds(hooks, g.opts.ProtectedKinds)
		if len(g.opts.ExemptNamespaces) > 0 {
			hooks = WithExemptions(hooks, g.opts.ExemptNamespaces)
		}
		g.desired = hooks
	}
	out := make([]admissionregistrationv1.ValidatingWebhook, len(g.desired))
	for i := range g.desired {
		out[i] = *g.desired[i].DeepCopy()
		if g.opts.CABundle != nil {
			out[i].ClientConfig.CABundle = g.opts.CABundle()
		}
	}
	return out, nil
}

// shape is DesiredWebhooks, or this version's own webhooks pointed where the
// live ones point.
func (g *AdmissionGuard) shape(ctx context.Context, live *admissionregistrationv1.ValidatingWebhookConfiguration) ([]admissionregistrationv1.ValidatingWebhook, error) {
	if g.opts.DesiredWebhooks != nil {
		return g.opts.DesiredWebhooks(ctx)
	}
	own, err := ShapeWebhooks()
	if err != nil {
		return nil, err
	}
	return PointedLike(own, live.Webhooks)
}
