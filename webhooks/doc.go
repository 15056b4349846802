// Package webhooks holds fencekeeper's validating admission webhooks; every
// operator replica serves them. Each is a thin handler that gathers its
// inputs (the requesting user, the registry entry, the stored object) and
// calls a pure decision that returns a verdict or field errors.
//
//   - ProtectedObjectValidator (protected_webhook.go) is the acceptance point.
//     The registry decides what is protected: it finds the FencedResource that
//     names the object (its annotation, or a cache index confirmed by a
//     linearizable GET), authenticates the grant against the trust bundle
//     (TrustBundleSource), reads the entry around the cache, and calls
//     fence.Decide. A denial's message starts with the verdict, and its status
//     details carry it as data (fence.CauseVerdict). Shadow turns denials into
//     warnings. StatusRecorder writes what the webhook saw (highest observed
//     fence, quarantine, deleted target, FenceRegression) to the entry's status.
//   - LockGrantValidator (lockgrant_webhook.go, breakglass.go): the owner is
//     the requesting user, one LockGrant per requestID, and only the owner
//     changes or deletes a LockGrant (the operator, an RBAC-authorized
//     break-glass user and namespace teardown are the audited exceptions).
//   - FencedResourceValidator (fencedresource_webhook.go): one entry per
//     target, a re-created entry starts above the fences its target accepted,
//     Enforce never goes back to Shadow, and an enforced entry cannot be
//     deleted while its target exists; it enrolls the namespace first.
//
// Registry validators answer 422 with field paths; the acceptance webhook
// answers 403 with the verdict.
package webhooks
