// Package webhooks holds fencekeeper's validating admission webhooks. Each
// webhook is a thin handler that gathers its inputs (the requesting user, the
// registry entry) and calls a pure validate function.
package webhooks

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// +kubebuilder:webhook:path=/validate-locks-fencekeeper-dev-v1alpha1-lockgrant,mutating=false,failurePolicy=fail,sideEffects=None,groups=locks.fencekeeper.dev,resources=lockgrants,verbs=create;update,versions=v1alpha1,name=vlockgrant.fencekeeper.dev,admissionReviewVersions=v1,timeoutSeconds=5

// LockGrantValidator admits LockGrants: the owner is the requesting user, the
// FencedResource exists and its policy allows the request, and requestIDs are unique.
type LockGrantValidator struct {
	// Reader serves uncached reads of FencedResources and LockGrants.
	Reader client.Reader
}

// SetupLockGrantWebhook registers the validator with the manager's webhook server.
func SetupLockGrantWebhook(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &locksv1.LockGrant{}).
		WithValidator(&LockGrantValidator{Reader: mgr.GetAPIReader()}).
		Complete()
}

// ValidateCreate checks a new request against the requesting user and the registry.
func (v *LockGrantValidator) ValidateCreate(ctx context.Context, lg *locksv1.LockGrant) (admission.Warnings, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, err
	}
	var fr locksv1.FencedResource
	err = v.Reader.Get(ctx, types.NamespacedName{Namespace: lg.Namespace, Name: lg.Spec.Resource}, &fr)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("spec.resource: FencedResource %q does not exist in namespace %q; create it first", lg.Spec.Resource, lg.Namespace)
	} else if err != nil {
		return nil, fmt.Errorf("read FencedResource %s/%s: %w", lg.Namespace, lg.Spec.Resource, err)
	}
	var list locksv1.LockGrantList
	// spec.resource is a selectable field of the CRD, so the server filters.
	if err := v.Reader.List(ctx, &list, client.InNamespace(lg.Namespace), client.MatchingFields{locksv1.LockGrantResourceField: lg.Spec.Resource}); err != nil {
		return nil, fmt.Errorf("list LockGrants in %s: %w", lg.Namespace, err)
	}
	return nil, validateLockGrantCreate(req.UserInfo.Username, lg, &fr, list.Items)
}

// ValidateUpdate lets only the owner change the request (renew or release).
func (v *LockGrantValidator) ValidateUpdate(ctx context.Context, oldLG, newLG *locksv1.LockGrant) (admission.Warnings, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, err
	}
	return nil, validateLockGrantUpdate(req.UserInfo.Username, oldLG, newLG)
}

// ValidateDelete allows deletion: deleting a held grant releases it.
func (v *LockGrantValidator) ValidateDelete(context.Context, *locksv1.LockGrant) (admission.Warnings, error) {
	return nil, nil
}

func validateLockGrantCreate(user string, lg *locksv1.LockGrant, fr *locksv1.FencedResource, existing []locksv1.LockGrant) error {
	if lg.Spec.Owner != user {
		return fmt.Errorf("spec.owner %q must equal the requesting user %q: a LockGrant can only be requested for yourself", lg.Spec.Owner, user)
	}
	if _, msg := fr.PolicyViolation(user, lg.Spec.OperationCategory); msg != "" {
		return fmt.Errorf("%s", msg)
	}
	for _, other := range existing {
		if other.Name != lg.Name && other.Spec.Resource == lg.Spec.Resource && other.Spec.RequestID == lg.Spec.RequestID {
			return fmt.Errorf("spec.requestID %q is already used by LockGrant %s for resource %s: reuse that LockGrant instead of creating a second identity",
				lg.Spec.RequestID, other.Name, lg.Spec.Resource)
		}
	}
	return nil
}

func validateLockGrantUpdate(user string, oldLG, newLG *locksv1.LockGrant) error {
	if !equality.Semantic.DeepEqual(oldLG.Spec, newLG.Spec) && user != oldLG.Spec.Owner {
		return fmt.Errorf("only the owner %q may renew or release this LockGrant (request by %q); delete it to revoke the request",
			oldLG.Spec.Owner, user)
	}
	return nil
}
