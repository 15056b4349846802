// Package lockclient is the worker side of fencekeeper: claim a resource,
// keep the claim alive, and write the protected object so that a write made
// after the claim ended is refused by the acceptance webhook.
//
// It is shaped like etcd's client/v3/concurrency: a Client makes Locks (a
// session with a server-side TTL and a Done channel); a Lock's Guard says
// whether new effects may start; an Operation commits the segments of one
// planned operation, each revalidated by the webhook. A restarted worker
// finds its grant again with Client.Attach and resumes its operation from the
// object's receipt log.
//
// The examples run against the embedded control plane (internal/localcp) with the
// operator, so they are tests as well as documentation.
//
// The lock's state follows docs/contract.md ("Worker client states"): REQUESTED → HELD → RENEWING → HELD;
// an uncertain renewal or query result is OWNERSHIP_UNKNOWN (start no new
// effects, but do not assume issued writes were revoked); EXPIRED only when the
// issuer confirms it; RELEASED after a confirmed voluntary release.
//
// Acquire learns that it holds from the registry: the FencedResource's
// status.holder, written with the signed grant by the very compare-and-swap
// that allocates the fence, names the LockGrant by UID one watch hop after
// that write, before the issuer mirrors it into the LockGrant's status. The
// LockGrant is watched too once the lock needs it (it alone records a request
// denied before it was held, and confirms renewals): after a second of
// waiting, at the first renewal, or at once without read access to the
// FencedResource; until then the registry's record of the grant's end ends
// the lock. An acquire and release within one renewal interval so costs the
// API server no read and no watch of its own. The registry watch belongs to
// the Client: one per resource, opened without a resourceVersion (so it
// starts with the registry as it is), shared by every request of the Client
// for that resource and kept open for a few seconds after the last one
// ends, so a worker that acquires in a loop opens it once. Release is one
// merge patch of spec.release: no read, no conflict; it returns on the
// registry's record of the grant's end (status.recentlyEnded, written by the
// compare-and-swap that ends it) on that same watch, or on the LockGrant's
// final status, whichever comes first.
//
// A lost create response is recovered by reading the LockGrant named
// deterministically from the requestID — never by creating a second identity.
//
// In a pod, NewForConfig learns the pod from the API server (the bound
// service-account token names it) and binds every request to it: the lease
// is "pod:<pod UID>", and the webhooks refuse the grant's use — writes,
// delete intents, deletes, renewals, releases — from any other pod, so
// replicas sharing a ServiceAccount never use each other's grants. Attach
// therefore works from the same pod (a restarted container) only.
//
// What a commit's result guarantees:
//   - nil: the segment is applied (its receipt is returned);
//   - a refusal (a *DenialError, a Guard error, any other error but
//     ErrMutationUnknown): nothing of this commit was written, and nothing
//     of it can be written later;
//   - ErrMutationUnknown (an *UnknownOutcomeError): nobody knows yet. It is
//     recorded on the LockGrant (retried for up to 30 s while the API server
//     is unreachable or answers Forbidden) and the operator surfaces it as
//     ReconciliationRequired after 15 minutes; Operation.Resolve decides it
//     later.
//
// A send that got no answer is resolved by reading the object (ResolveSent):
// applied (its receipt is in the log: reuse it), proven absent (send it
// again under the current fence), in flight, or undeterminable. A read that
// does not show the write proves nothing while the write may still land: the
// API server may have admitted it and be waiting on etcd, whose transaction
// is conditioned on the resourceVersion the client read, and commits whenever
// etcd lets it. So absence is proven only once the write can no longer land:
// the object moved past that version, or is gone (for a create: the object
// exists without it). Until then the send is in flight: the segment is sent
// again (only one of the two can land, both being conditioned on the same
// version), and if that is refused, or the grant ends, or ctx ends, the
// result is ErrMutationUnknown, never the refusal (make chaos found a segment
// reported NOT_HELD that landed seconds later). Deletes follow the same rule
// with their resourceVersion precondition.
//
// A grant fences writes to a PostgreSQL database too (pkg/pgfence, a store
// the FencedResource names in spec.stores): Operation.CommitTx runs the
// caller's change in a transaction whose first statement begins the next
// segment at the database, which refuses it as the webhook would. It waits
// until the operator has published the grant there, numbers the segment
// from the store's fence state, and gives the same results as Commit: a
// *DenialError for a refusal, ErrExpired and the like from Guard, and
// ErrMutationUnknown (recorded on the LockGrant) for a COMMIT whose answer
// was lost and that the receipts cannot decide; one they prove absent is
// committed again. It takes a pool (*pgxpool.Pool): a lost answer is
// resolved on another connection than the one that was cut.
//
// Deleting a protected object is a fenced step too (Operation.Delete): the
// webhook lets the owner of the current grant delete only after that grant
// committed a segment declaring intent "delete" as the object's last one, so
// a stale process sharing the holder's identity cannot delete on its own.
// Delete commits that segment and deletes with the resourceVersion it wrote
// as precondition; a change in between is ErrChangedSinceIntent.
package lockclient
