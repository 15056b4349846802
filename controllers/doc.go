// Package controllers holds fencekeeper's reconcilers. Only the elected
// leader runs them (every replica serves the webhooks).
//
// The issuer is three pieces with one name: its pure decision
// (internal/rules/issuer), its identity here, and the reconciler that applies
// the decision.
//
//   - IssuerIdentity (issuer_identity.go) is the leader's signing identity:
//     on becoming leader it loads (or on first start creates) the signing key
//     and trust bundle, increments the issuer epoch by compare-and-swap on its
//     record, and gates every reconciler until then.
//   - IssuerReconciler (issuer_controller.go) runs the lease lifecycle of
//     one FencedResource at a time: gather (cache, plus uncached reads where a
//     stale view could issue a fence twice, and its own last registry write
//     while the cache does not show it yet, ownwrites.go) → decide
//     (issuer.Decide, pure, confirmed by issuer.DecideConfirmed's reads
//     around the cache) → commit
//     (one compare-and-swap of the FencedResource status, the only place a
//     fence is allocated) → mirror (Events, then the LockGrant writes handed
//     to the grantWriter, grant_writer.go, which writes them outside the
//     resource's pass: the ended grants' statuses, then the new holder's,
//     then the bookkeeping of waiters and finalizers, a bounded share per
//     turn). A new Held or Pending phase is mirrored late
//     (status_mirror.go), arrivals that are the only change are deferred,
//     and arrivals while the lock is held are confirmed by reads outside
//     the pass (arrivals.go).
//   - TrustBundleReconciler (trustbundle_controller.go) follows the trust
//     bundle and drives key rotation (keyrotation.go: stage a key, wait until
//     every verifier trusts it, sign with it under a new epoch, revoke the
//     older epochs, retire the old key); a raised revokedBelowEpoch makes
//     every FencedResource be decided again, so grants of older epochs are
//     revoked and their waiters served.
//   - UnresolvedMutationReconciler (reconciliation_controller.go) turns a
//     worker's unresolved-mutation record on a LockGrant into the
//     FencedResource's ReconciliationRequired condition once it is overdue.
//   - NamespaceEnrollmentReconciler (enrollment_controller.go) keeps the
//     fencekeeper.dev/enrolled label on every namespace that holds an entry,
//     so unlabelled objects there reach the acceptance webhook.
//   - EndedGrantCollector (collector.go) deletes LockGrants ended longer than
//     the retention, and the oldest beyond a count, except those recording an
//     unresolved write. It keeps them in an index ordered by end time, fed by
//     the informer, so a pass looks only at what is due.
//
// Setup (setup.go) wires them into a manager; CacheOptions (cache.go) keeps
// only what they read of tenants' objects, indexes.go indexes the LockGrants
// a reconcile can act on, and metrics.go registers their Prometheus metrics.
package controllers
