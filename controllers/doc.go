// Package controllers holds fencekeeper's reconcilers. Only the elected
// leader runs them (every replica serves the webhooks).
//
//   - Issuer (issuer.go) is the leader's issuing identity: on becoming leader
//     it loads (or on first start creates) the signing key and trust bundle,
//     increments the issuer epoch by compare-and-swap on its record, and gates
//     every reconciler until then.
//   - GrantIssuerReconciler (issuer_controller.go) runs the lease lifecycle of
//     one FencedResource at a time: gather (cache, plus uncached reads where a
//     stale view could issue a fence twice) → decide (internal/issuing.Decide,
//     pure, confirmed by DecideConfirmed's reads around the cache) → commit
//     (one compare-and-swap of the FencedResource status, the only place a
//     fence is allocated) → mirror (Events, LockGrant statuses, finalizers;
//     a new Held phase 100 ms late, Pending 1 s late: freshholds.go), in that order.
//   - TrustBundleReconciler (trustbundle_controller.go) follows the trust
//     bundle: a raised revokedBelowEpoch makes every FencedResource be decided
//     again, so grants of older epochs are revoked and their waiters served.
//   - UnresolvedMutationReconciler (reconciliation_controller.go) turns a
//     worker's unresolved-mutation record on a LockGrant into the
//     FencedResource's ReconciliationRequired condition once it is overdue.
//   - NamespaceEnrollmentReconciler (enrollment_controller.go) keeps the
//     fencekeeper.dev/enrolled label on every namespace that holds an entry,
//     so unlabelled objects there reach the acceptance webhook.
//
// Setup (setup.go) wires them into a manager; metrics.go registers their
// Prometheus metrics.
package controllers
