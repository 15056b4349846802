// Package sim is fencekeeper's deterministic simulator: the failure matrix of
// docs/gates.md, run as many seeded schedules on one machine.
//
// One schedule is a small world with a virtual clock: an in-memory registry
// (the FencedResource, its LockGrants and the trust bundle) whose issuer is the
// issuer's real decision (issuer.Decide), an in-memory protected ConfigMap whose every
// write goes through the real admission webhook
// (webhooks.ProtectedObjectValidator.Handle, which calls fence.DecideWrite), and a
// few workers that follow the contract's client rules (REQUESTED, HELD, RENEWING,
// OWNERSHIP_UNKNOWN, EXPIRED, RELEASED; MUTATION_UNKNOWN resolved from
// receipts). Every message between them travels through a network the seeded
// scheduler controls: it reorders, delays, drops and duplicates them, pauses
// workers, restores registry snapshots and lets an adversary send forged,
// tampered, oversized and replayed fence annotations.
//
// An oracle written from the contract's rules (docs/contract.md), not from the implementation,
// judges every write the webhook let through, and a linearizability checker
// (porcupine) checks that what the clients observed is a history of a fenced
// register. Run computes the release-gate report; see docs/gates.md.
package sim
