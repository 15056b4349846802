// Package pgfence extends fencekeeper's fencing to a PostgreSQL database:
// a write to a business table lands only inside a transaction whose first
// statement, fencekeeper.begin_segment, accepted a segment of a current
// grant, in fence and segment order. The database enforces it, so a paused
// worker whose lease ended is refused by the database itself (STALE_OWNER),
// and a worker that bypasses the library is refused too (FENCE_REQUIRED).
//
// Install puts the versioned schema fencekeeper into a database (one
// transaction, under an advisory lock; each version applied once, in order,
// so installing version N+1 over N keeps every row):
//   - resources: one row per resourceID with its fence state (highest
//     fence, operation root, last segment, grant digest, the last accepted
//     envelope's digest, the transaction that last began a segment);
//   - grants: every grant the registry issued for those resources and its
//     end, written only by the operator's role (PublishGrant, EndGrant);
//   - receipts: every accepted segment, kept while its fence is the highest;
//   - begin_segment(envelope): Decide's rules, in pkg/fence's order, with
//     the same verdict codes; a refusal is SQLSTATE FK000 whose message
//     starts with the code (ALREADY_APPLIED carries the original receipt);
//   - protect(table, resourceID): a trigger refusing any change of the
//     table outside an accepted segment of that resource, except by the
//     break-glass roles the installation names (audited);
//   - Shadow: a resource published in Shadow has its refusals recorded in
//     shadow_refusals and raised as warnings, and the transaction goes on.
//
// A database cannot verify Ed25519, so the registry is its trust anchor:
// the operator publishes each grant it issues, its renewals and its end,
// and the issuer's revocation. A grant never published is FORGED_GRANT
// (WRONG_RESOURCE when the store serves no such resource). What a database
// cannot know is not judged there: the caller's Kubernetes identity and
// pod (the database role is who writes; give each worker fleet its own
// role), and the digest of the change (the envelope's payload is the
// client's statement of it). test/pgfence runs one table of cases through
// fence.Decide and through begin_segment, so the two cannot drift.
//
// Commit sends BEGIN and the segment's first statement as one message
// (begin_segment_enforced, schema version 3), so a fenced transaction has a
// plain one's round trips; Shadow and older schemas take BEGIN, then
// begin_segment. A commit whose answer was lost is resolved through the
// receipts (Resolve): the receipt and the business change are one transaction.
package pgfence
