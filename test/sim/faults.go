package sim

import (
	"math/rand/v2"
	"slices"
	"strings"
)

// Fault is one row of the failure matrix.
type Fault int

// faultNone tags requests no fault produced.
const faultNone = -1

// The failure matrix (docs/gates.md), then the faults the contract's
// verdict list adds (docs/contract.md, "Verdicts").
const (
	FaultOwnerPause Fault = iota
	FaultLostRenewalResponse
	FaultLostAcquireResponse
	FaultReleaseReacquire
	FaultOutOfOrderSegment
	FaultDuplicateSegment
	FaultDifferentPayload
	FaultDelayedMessage
	FaultReplayOldEnvelope
	FaultRestoreSnapshot
	FaultLostWriteAck
	FaultForgedGrant
	FaultOversizedToken
	FaultTamperedGrant
	FaultCrossResource
	FaultRevokedEpoch
	FaultStolenGrant
	FaultPayloadMismatch
	FaultUnfencedWrite
	FaultIssuerFailover
	FaultPolicyChange
	FaultReceiptLog
	// Writes and deletes outside a labelled update.
	FaultStrangerCreate
	FaultPlantedCreate
	FaultProtectionRemoved
	FaultUndeclaredDelete
	FaultDeclaredDelete
	FaultNamespaceTeardown
	FaultIndexLag
	// FaultPlantedOwnForgery: in the index-lag window, an unlabelled create
	// carrying an envelope forged for this very resource, with receipts.
	FaultPlantedOwnForgery
	// FaultIssuerCacheLag: the issuer's LockGrant cache lags the API
	// server, so it may show a request that was granted (and has ended)
	// as still waiting.
	FaultIssuerCacheLag
	// FaultMirrorLost: the issuer dies right after its compare-and-swap, for
	// one to three decisions in a row: the LockGrant statuses and finalizers
	// that follow are never written (the next decision rebuilds them).
	FaultMirrorLost
	// FaultSharedIdentity: another replica of the holder's ServiceAccount
	// (same identity, its own pod) reads the holder's grant from the
	// object's fence annotation and writes, declares a delete or deletes
	// under it.
	FaultSharedIdentity
	// FaultHolderGrantDeleted: the holder's LockGrant is deleted (by its
	// owner or a break-glass admin) while it holds. LockGrants carry no
	// finalizer, so it is gone at once: the issuer learns it from a read
	// around its cache, and the worker from a read of its LockGrant, in
	// either order, while the worker may still be writing.
	FaultHolderGrantDeleted
	numFaults
)

var faultNames = [numFaults]string{
	"owner pause past TTL", "lost renewal response", "lost acquire response", "release + immediate reacquire",
	"out-of-order segment", "duplicate segment", "different-payload segment", "delayed message",
	"replayed old envelope", "restored registry snapshot", "lost write ACK", "forged grant",
	"oversized/out-of-range token", "tampered grant", "cross-resource proof replay", "revoked issuer epoch",
	"stolen grant (other identity)", "payload mismatch", "write without fresh fence", "issuer failover (new epoch)",
	"policy change (fenceFloor raised)", "tampered receipt log",
	"stranger creates the absent target", "planted envelope/receipts on create", "protection label/annotation removed",
	"undeclared delete (holder's identity)", "declared delete + re-create", "namespace teardown", "webhook index lags entry creation",
	"planted forgery naming this resource (index lag)", "issuer's LockGrant cache lags",
	"LockGrant writes lost after the CAS", "holder's grant used from another pod of its identity",
	"holder's LockGrant deleted",
}

func (f Fault) String() string {
	if f < 0 || f >= numFaults {
		return "none"
	}
	return faultNames[f]
}

// AllFaults lists every fault.
func AllFaults() []Fault {
	fs := make([]Fault, numFaults)
	for i := range fs {
		fs[i] = Fault(i)
	}
	return fs
}

// faultPlan is which faults one schedule injects, and how many.
type faultPlan struct {
	enabled    []Fault
	suppressed []Fault // drawn but not applied (see Config.Suppress)
	budget     int
}

// newFaultPlan picks a random half of the allowed faults (at least one) and a
// budget of injections, so schedules differ in which faults combine.
func newFaultPlan(rng *rand.Rand, allowed, suppressed []Fault) faultPlan {
	if allowed == nil {
		allowed = AllFaults()
	}
	p := faultPlan{suppressed: suppressed}
	for _, f := range allowed {
		if rng.IntN(2) == 0 {
			p.enabled = append(p.enabled, f)
		}
	}
	if len(p.enabled) == 0 && len(allowed) > 0 {
		p.enabled = append(p.enabled, allowed[rng.IntN(len(allowed))])
	}
	p.budget = 3 + rng.IntN(8)
	return p
}

// due proposes an injection now and then.
func (p *faultPlan) due(rng *rand.Rand) bool {
	return p.budget > 0 && len(p.enabled) > 0 && rng.IntN(20) == 0
}

func (p faultPlan) String() string {
	names := make([]string, len(p.enabled))
	for i, f := range p.enabled {
		names[i] = f.String()
	}
	return strings.Join(names, ", ")
}

// planned reports whether the schedule injects f (enabled, not suppressed).
func (p *faultPlan) planned(f Fault) bool {
	return slices.Contains(p.enabled, f) && !slices.Contains(p.suppressed, f)
}
