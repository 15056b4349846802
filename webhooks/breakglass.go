package webhooks

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// BreakGlassVerb is the custom RBAC verb that lets a human override
// ownership of a LockGrant (docs/security.md, "Break-glass"). RBAC has no built-in meaning for
// it: a Role grants it like any verb, and cluster-admin's "*" includes it.
const BreakGlassVerb = "break-glass"

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// BreakGlassAuthorizer asks the API server's authorizers (RBAC and whatever
// else the cluster runs) whether the admission request's user holds the
// break-glass verb on one object.
type BreakGlassAuthorizer struct {
	// Client creates SubjectAccessReviews (never cached: they are create-only).
	Client client.Client
}

// Allowed reports whether user may use break-glass on group/resource name in
// namespace. The review carries the request's user, groups, UID and extra, so
// it judges exactly who asked, not the webhook's own identity.
func (a *BreakGlassAuthorizer) Allowed(ctx context.Context, user authenticationv1.UserInfo, group, resource, namespace, name string) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: BreakGlassVerb, Group: group, Resource: resource, Name: name,
		},
	}}
	if err := a.Client.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("SubjectAccessReview of %q for %s on %s %s/%s: %w", user.Username, BreakGlassVerb, resource, namespace, name, err)
	}
	return sar.Status.Allowed && !sar.Status.Denied, nil
}

var (
	lockGrantBreakGlass = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_lockgrant_break_glass_total",
		Help: "Changes and deletes of another owner's LockGrant admitted by break-glass (each is also an Event BreakGlass), by operation.",
	}, []string{"operation"})
	lockGrantNamespaceDeletions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_lockgrant_namespace_deletions_total",
		Help: "LockGrants the namespace controller deleted while their namespace terminated (each is also an Event NamespaceDeletion).",
	})
	lockGrantDenied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_lockgrant_denied_total",
		Help: "Changes and deletes of a LockGrant denied because the requester is not its owner, by operation.",
	}, []string{"operation"})
)

func init() {
	metrics.Registry.MustRegister(lockGrantBreakGlass, lockGrantNamespaceDeletions, lockGrantDenied)
}
