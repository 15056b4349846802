package webhooks

import (
	"context"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// +kubebuilder:webhook:path=/validate-locks-fencekeeper-dev-v1alpha1-fencedresource,mutating=false,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=locks.fencekeeper.dev,resources=fencedresources,verbs=create;update;delete,versions=v1alpha1,name=vfencedresource.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get

// FencedResourceValidator keeps resource-side validation on once enforced: an
// entry is made only for a kind whose writes the acceptance webhook sees, an
// Enforce entry never goes back to Shadow, and it cannot be deleted while the
// object it protects exists.
type FencedResourceValidator struct {
	// Reader reads the target and the webhook configuration around the cache.
	Reader client.Reader
	// Index is the cache with FencedResources indexed by target: entries
	// stored long ago (before target claims existed) are found there.
	Index client.Reader
	// Writer enrolls the entry's namespace and writes target claims.
	Writer client.Writer
	// Mapper maps the target's kind to its resource.
	Mapper meta.RESTMapper
	// WebhookConfiguration is the installation's ValidatingWebhookConfiguration.
	WebhookConfiguration string
	// Namespace is the operator's namespace, where target claims live.
	Namespace string
	// ClaimGrace overrides TargetClaimGrace (tests).
	ClaimGrace time.Duration
	// Bundle verifies the fence state a target already carries: only a
	// genuine grant of this resource raises the floor a new entry needs.
	Bundle *TrustBundleSource
	// Exempt are the namespaces never enrolled: no entry is created there.
	Exempt enrollment.Exemptions
}

// SetupFencedResourceWebhook registers the validator; webhookConfiguration
// names the installation's ValidatingWebhookConfiguration, namespace is
// the operator's and exempt the namespaces where no entry may be created.
// It reads the target index SetupProtectedWebhook adds.
func SetupFencedResourceWebhook(mgr ctrl.Manager, webhookConfiguration, namespace string, exempt enrollment.Exemptions) error {
	if err := mgr.Add(&TargetClaimCollector{Claims: mgr.GetAPIReader(), Entries: mgr.GetClient(), Writer: mgr.GetClient(), Namespace: namespace}); err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr, &locksv1.FencedResource{}).
		WithValidator(&FencedResourceValidator{
			Reader: mgr.GetAPIReader(), Index: mgr.GetCache(), Writer: mgr.GetClient(), Mapper: mgr.GetRESTMapper(),
			WebhookConfiguration: webhookConfiguration, Namespace: namespace, Exempt: exempt,
			Bundle: &TrustBundleSource{Reader: mgr.GetClient(), Key: types.NamespacedName{Namespace: namespace, Name: locksv1.TrustBundleConfigMap}},
		}).
		Complete()
}

// ValidateCreate refuses a registry entry that would issue fences the target
// already accepted (a deleted and re-created entry starts again at fence 1):
// spec.fenceFloor must be at least the target's highest fence.
func (v *FencedResourceValidator) ValidateCreate(ctx context.Context, fr *locksv1.FencedResource) (admission.Warnings, error) {
	if err := v.refuseOutright(fr); err != nil {
		return nil, err
	}
	if fr.Spec.Target == nil {
		return nil, nil
	}
	// Without an admission request (the simulator calls the validator
	// directly) the create is a real one.
	req, err := admission.RequestFromContext(ctx)
	dry := err == nil && dryRun(req)
	if err == nil && !dry {
		if err := enrollment.Ensure(ctx, v.Writer, v.Reader, v.Exempt, fr.Namespace); err != nil {
			return nil, err
		}
	}
	// The cache knows every entry stored more than a moment ago, which is
	// all an entry made before target claims existed can be; the claim below
	// decides between entries created at the same moment.
	var others locksv1.FencedResourceList
	if err := v.Index.List(ctx, &others, client.InNamespace(fr.Namespace),
		client.MatchingFields{locksv1.FencedResourceTargetField: fr.Spec.Target.Key()}); err != nil {
		return nil, fmt.Errorf("look up the FencedResources of %s %s: %w", fr.Spec.Target.Kind, fr.Spec.Target.Name, err)
	}
	if errs := validateUniqueTarget(fr, others.Items); len(errs) > 0 {
		return nil, invalidFencedResource(fr, errs)
	}
	if err := v.validateTargetSeen(ctx, fr); err != nil {
		return nil, err
	}
	target, err := v.target(ctx, fr)
	if err != nil {
		return nil, err
	}
	if target != nil {
		_, stored, err := v.Bundle.GetWithRetired(ctx)
		if err != nil {
			return nil, err
		}
		if err := invalidFencedResource(fr, validateFloorAboveTarget(fr, target.GetAnnotations()[fence.AnnotationFence], stored)); err != nil {
			return nil, err
		}
	}
	if dry {
		return nil, nil
	}
	// Last, so that a create refused above leaves no claim behind.
	return nil, v.claimTarget(ctx, fr)
}

// refuseOutright refuses what no lookup can make right, before anything
// is read or written: an entry in an exempt namespace (it would enroll it,
// or promise a protection the webhooks never give there), and malformed
// spec.stores.
func (v *FencedResourceValidator) refuseOutright(fr *locksv1.FencedResource) error {
	if err := v.Exempt.Refusal(fr.Namespace); err != nil {
		return apierrors.NewForbidden(locksv1.GroupVersion.WithResource("fencedresources").GroupResource(), fr.Name, err)
	}
	return invalidFencedResource(fr, validateStores(fr.Spec.Stores))
}

// validateUniqueTarget: one object has one registry entry.
func validateUniqueTarget(fr *locksv1.FencedResource, others []locksv1.FencedResource) field.ErrorList {
	for _, o := range others {
		if o.Name != fr.Name && o.Spec.Target != nil && *o.Spec.Target == *fr.Spec.Target {
			return field.ErrorList{field.Invalid(field.NewPath("spec", "target"), *fr.Spec.Target,
				fmt.Sprintf("%s %s is already protected by FencedResource %s; one object has one registry entry", fr.Spec.Target.Kind, fr.Spec.Target.Name, o.Name))}
		}
	}
	return nil
}

// validateFloorAboveTarget refuses an entry that would issue fences its target
// already accepted (a deleted and re-created entry starts again at fence 1).
// Only a genuine grant of this resource counts, as in the acceptance webhook
// (fence.VerifiesFor): fence state anyone could plant on the object before it had an
// entry (fence 2^63-1, a bogus proof) once made its entry impossible to
// create, whatever floor the schema allows.
func validateFloorAboveTarget(fr *locksv1.FencedResource, fenceAnnotation string, bundle *grant.TrustBundle) field.ErrorList {
	e, err := fence.ParseEnvelope(fenceAnnotation)
	if err != nil || !fence.VerifiesFor(fenceAnnotation, fr.Spec.ResourceID, bundle) || e.Grant.FenceToken <= fr.Spec.FenceFloor {
		return nil
	}
	f := e.Grant.FenceToken
	return field.ErrorList{field.Invalid(field.NewPath("spec", "fenceFloor"), fr.Spec.FenceFloor,
		fmt.Sprintf("target %s %s already accepted fence %d: set spec.fenceFloor to at least %d so that no fence is issued twice", fr.Spec.Target.Kind, fr.Spec.Target.Name, f, f))}
}

// invalidFencedResource is the 422 answer for errs (nil when there are none).
func invalidFencedResource(fr *locksv1.FencedResource, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(locksv1.GroupVersion.WithKind("FencedResource").GroupKind(), fr.Name, errs)
}

// ValidateUpdate denies Enforce → Shadow, and Shadow → Enforce for a kind
// whose writes the acceptance webhook no longer sees.
func (v *FencedResourceValidator) ValidateUpdate(ctx context.Context, oldFR, newFR *locksv1.FencedResource) (admission.Warnings, error) {
	if errs := append(validateEnforcementRatchet(oldFR, newFR), validateStores(newFR.Spec.Stores)...); len(errs) > 0 {
		return nil, invalidFencedResource(newFR, errs)
	}
	if newFR.Spec.Target != nil && oldFR.Spec.Enforcement != locksv1.EnforcementEnforce && newFR.Spec.Enforcement == locksv1.EnforcementEnforce {
		return nil, v.validateTargetSeen(ctx, newFR)
	}
	return nil, nil
}

// validateTargetSeen refuses an entry for a kind whose writes the acceptance
// webhook does not see: not served, not declared (--protected-kinds), or not
// in the live configuration's rules with every subresource. Such an entry
// would promise a protection nobody gives — writes of an undeclared kind
// never reach the webhook. The live configuration is read, not the flags,
// because it is what the API server acts on.
func (v *FencedResourceValidator) validateTargetSeen(ctx context.Context, fr *locksv1.FencedResource) error {
	t := fr.Spec.Target
	path := field.NewPath("spec", "target")
	gv, err := schema.ParseGroupVersion(t.APIVersion)
	if err != nil {
		return invalidFencedResource(fr, field.ErrorList{field.Invalid(path.Child("apiVersion"), t.APIVersion, err.Error())})
	}
	mapping, err := v.Mapper.RESTMapping(gv.WithKind(t.Kind).GroupKind(), gv.Version)
	switch {
	case meta.IsNoMatchError(err):
		return invalidFencedResource(fr, field.ErrorList{field.Invalid(path, t.Kind+" "+t.APIVersion,
			fmt.Sprintf("kind %s in %s is not served by the API server", t.Kind, t.APIVersion))})
	case err != nil:
		return fmt.Errorf("map kind %s in %s to its resource: %w", t.Kind, t.APIVersion, err)
	}
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := v.Reader.Get(ctx, types.NamespacedName{Name: v.WebhookConfiguration}, &cfg); err != nil {
		return fmt.Errorf("read the webhook configuration %s (the operator needs get on it): %w", v.WebhookConfiguration, err)
	}
	if gaps := protectedkinds.ConfigurationGaps(&cfg, mapping.Resource); len(gaps) > 0 {
		return invalidFencedResource(fr, field.ErrorList{field.Invalid(path, t.Kind+" "+t.APIVersion,
			"the acceptance webhook does not see every write of "+protectedkinds.Format(mapping.Resource)+", so this entry would protect nothing: "+strings.Join(gaps, "; "))})
	}
	return nil
}

// ValidateDelete denies deleting an enforced entry whose target still exists.
func (v *FencedResourceValidator) ValidateDelete(ctx context.Context, fr *locksv1.FencedResource) (admission.Warnings, error) {
	if fr.Spec.Enforcement != locksv1.EnforcementEnforce || fr.Spec.Target == nil {
		return nil, nil
	}
	if req, err := admission.RequestFromContext(ctx); err == nil && req.UserInfo.Username == locksv1.NamespaceControllerUsername {
		// Namespace teardown: the entry goes with its namespace.
		if terminating, err := NamespaceTerminating(ctx, v.Reader, fr.Namespace); err != nil || terminating {
			return nil, err
		}
	}
	t := fr.Spec.Target
	if target, err := v.target(ctx, fr); target == nil || err != nil {
		return nil, err
	}
	return nil, apierrors.NewForbidden(locksv1.GroupVersion.WithResource("fencedresources").GroupResource(), fr.Name,
		fmt.Errorf("it enforces fencing for %s %s, which still exists: resource-side validation is never disabled once enforced; delete the target first", t.Kind, t.Name))
}

// target reads the target's metadata around the cache; nil when it does not exist.
func (v *FencedResourceValidator) target(ctx context.Context, fr *locksv1.FencedResource) (*metav1.PartialObjectMetadata, error) {
	t := fr.Spec.Target
	gv, err := schema.ParseGroupVersion(t.APIVersion)
	if err != nil {
		return nil, invalidFencedResource(fr, field.ErrorList{field.Invalid(field.NewPath("spec", "target", "apiVersion"), t.APIVersion, err.Error())})
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(gv.WithKind(t.Kind))
	err = v.Reader.Get(ctx, types.NamespacedName{Namespace: fr.Namespace, Name: t.Name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("cannot read target %s %s (%v); the operator needs get on it", t.Kind, t.Name, err)
	}
	return obj, nil
}

// validateEnforcementRatchet: Shadow → Enforce only.
func validateEnforcementRatchet(oldFR, newFR *locksv1.FencedResource) field.ErrorList {
	if oldFR.Spec.Enforcement == locksv1.EnforcementEnforce && newFR.Spec.Enforcement != locksv1.EnforcementEnforce {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "enforcement"), newFR.Spec.Enforcement,
			"may go from Shadow to Enforce only: resource-side validation is never disabled once enforced")}
	}
	return nil
}

// validateStores checks spec.stores as the CRD schema does, with messages
// naming the field and the limit: at most MaxStores entries, each a unique
// DNS-label name and a Secret (a DNS-subdomain name, a Secret key).
func validateStores(stores []locksv1.StoreReference) field.ErrorList {
	path := field.NewPath("spec", "stores")
	if len(stores) > locksv1.MaxStores {
		return field.ErrorList{field.TooMany(path, len(stores), locksv1.MaxStores)}
	}
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, s := range stores {
		p := path.Index(i)
		errs = append(errs, validateStoreName(p.Child("name"), s.Name)...)
		if seen[s.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), s.Name))
		}
		seen[s.Name] = true
		errs = append(errs, validateStoreSecret(p.Child("secretRef"), s.SecretRef)...)
	}
	return errs
}

func validateStoreName(p *field.Path, name string) field.ErrorList {
	if len(name) > validation.DNS1123LabelMaxLength {
		return field.ErrorList{field.TooLong(p, name, validation.DNS1123LabelMaxLength)}
	}
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, name, "a store name must be a DNS label: "+strings.Join(msgs, "; "))}
	}
	return nil
}

func validateStoreSecret(p *field.Path, ref locksv1.StoreSecretReference) field.ErrorList {
	var errs field.ErrorList
	switch {
	case len(ref.Name) > validation.DNS1123SubdomainMaxLength:
		errs = append(errs, field.TooLong(p.Child("name"), ref.Name, validation.DNS1123SubdomainMaxLength))
	default:
		if msgs := validation.IsDNS1123Subdomain(ref.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("name"), ref.Name, "a Secret name must be a DNS subdomain: "+strings.Join(msgs, "; ")))
		}
	}
	if ref.Key == "" {
		return errs // the default, "dsn"
	}
	if len(ref.Key) > validation.DNS1123SubdomainMaxLength {
		return append(errs, field.TooLong(p.Child("key"), ref.Key, validation.DNS1123SubdomainMaxLength))
	}
	if msgs := validation.IsConfigMapKey(ref.Key); len(msgs) > 0 {
		errs = append(errs, field.Invalid(p.Child("key"), ref.Key, "must be a Secret key: "+strings.Join(msgs, "; ")))
	}
	return errs
}
