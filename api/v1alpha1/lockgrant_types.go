package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LockGrantPhase is where a LockGrant is in its life.
// +kubebuilder:validation:Enum=Pending;Held;Expired;Released;Revoked;Denied
type LockGrantPhase string

const (
	// PhasePending is a request queued, FIFO by arrival.
	PhasePending LockGrantPhase = "Pending"
	// PhaseHeld is the resource's current holder.
	PhaseHeld LockGrantPhase = "Held"
	// PhaseExpired is a grant whose renewal did not arrive before expiresAt (judged by the issuer's clock).
	PhaseExpired LockGrantPhase = "Expired"
	// PhaseReleased is a grant released voluntarily (spec.release or deletion).
	PhaseReleased LockGrantPhase = "Released"
	// PhaseRevoked is a grant issued under an issuer epoch that the trust bundle revoked.
	PhaseRevoked LockGrantPhase = "Revoked"
	// PhaseDenied is a request that can never be served (policy, unsignable, or a duplicate of the owner's requestID).
	PhaseDenied LockGrantPhase = "Denied"
)

// Terminal reports whether the phase can never change again.
func (p LockGrantPhase) Terminal() bool {
	switch p {
	case PhaseExpired, PhaseReleased, PhaseRevoked, PhaseDenied:
		return true
	}
	return false
}

// GrantFinalizer is the release finalizer earlier versions put on every live
// LockGrant. None is put on now (a vanished holder is found by an uncached
// read); the issuer removes it from a LockGrant being deleted that holds
// nothing, and uninstall removes what is left.
const GrantFinalizer = "locks.fencekeeper.dev/release"

// AnnotationUnresolvedMutation marks, on the LockGrant, a fenced write whose
// outcome the worker could not determine from the receipt log (JSON
// UnresolvedMutation). The operator surfaces records older than
// UnresolvedMutationDeadline as the FencedResource's ReconciliationRequired
// condition; whoever reconciles the object removes the annotation.
const AnnotationUnresolvedMutation = "fencekeeper.dev/unresolved-mutation"

// MaxLockGrantMetadataBytes bounds what a tenant attaches to a LockGrant:
// its labels and annotations (keys and values), finalizers and owner
// references, in bytes together. Every operator replica caches every
// LockGrant; the LockGrant webhook refuses a create or an owner's update
// over it.
const MaxLockGrantMetadataBytes = 16 << 10

// UnresolvedMutationDeadline is how long an UNKNOWN outcome may stay
// unresolved before it needs a human (docs/contract.md, "Release gates").
const UnresolvedMutationDeadline = 15 * time.Minute

// UnresolvedMutation is the AnnotationUnresolvedMutation record.
// +kubebuilder:object:generate=false
type UnresolvedMutation struct {
	// object is Kind/name of the protected object.
	Object string `json:"object"`
	// operation, fence, segment and payload identify the write.
	Operation string `json:"operation"`
	Fence     int64  `json:"fence"`
	Segment   int64  `json:"segment"`
	Payload   string `json:"payload"`
	// since is when the worker gave up resolving it (the worker's clock).
	Since time.Time `json:"since"`
}

// Condition types and reasons of a LockGrant.
const (
	// ConditionIssued is True once the grant was issued; its reason is the current phase.
	ConditionIssued = "Issued"

	ReasonQueued           = "Queued"
	ReasonIssued           = "Issued"
	ReasonRenewed          = "Renewed"
	ReasonExpired          = "Expired"
	ReasonReleased         = "Released"
	ReasonDeleted          = "Deleted"
	ReasonRevoked          = "EpochRevoked"
	ReasonPolicyChanged    = "PolicyChanged"
	ReasonOwnerNotAllowed  = "OwnerNotAllowed"
	ReasonCategoryDenied   = "OperationCategoryNotAllowed"
	ReasonDuplicateRequest = "DuplicateRequestID" // another LockGrant of the owner with this requestID is served
	ReasonNoSuchResource   = "FencedResourceNotFound"
	// ReasonUnsignable: no grant can be signed for the request (a field
	// longer than a grant holds, counted in bytes); see UnsignableRequest.
	ReasonUnsignable = "RequestCannotBeSigned"
)

// LockGrantSpec is one acquisition request. Everything but renewals and release is immutable.
type LockGrantSpec struct {
	// resource is the name of the FencedResource, in the same namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="resource must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="resource is immutable"
	Resource string `json:"resource"`

	// owner is the requesting workload identity; it must equal the creating user's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="owner must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="owner is immutable"
	Owner string `json:"owner"`

	// requestID is the owner's idempotency key: one LockGrant per resource,
	// owner and requestID; another owner's requestID is another request. The
	// client library names the LockGrant LockGrantName(resource, owner,
	// requestID): the resource name, a dash and 16 lowercase hex digits of
	// SHA-256 over the three joined by NUL (so requestID holds no NUL). Any
	// other name is allowed (a LockGrant written by hand), except one ending
	// in a dash and 16 lowercase hex digits that is not this request's own.
	// Of two LockGrants of one owner with one requestID, the issuer serves
	// one and denies the other (DuplicateRequestID).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="requestID must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="requestID is immutable"
	RequestID string `json:"requestID"`

	// lease is the holder's session ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="lease must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="lease is immutable"
	Lease string `json:"lease"`

	// operationRoot is sha256:<hex> of the planned operation.
	// +required
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="operationRoot is immutable"
	OperationRoot string `json:"operationRoot"`

	// operationCategory classifies the operation; the FencedResource may restrict it.
	// +optional
	// +kubebuilder:default=""
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="operationCategory must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="operationCategory is immutable"
	OperationCategory string `json:"operationCategory,omitempty"`

	// renewals is bumped by the holder to renew; it may only grow.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="renewals may only grow"
	Renewals int64 `json:"renewals,omitempty"`

	// release set to true releases the grant (or withdraws a pending request); it cannot be unset.
	// +optional
	// +kubebuilder:default=false
	// +kubebuilder:validation:XValidation:rule="self || !oldSelf",message="release cannot be undone"
	Release bool `json:"release,omitempty"`
}

// GrantDocument is the lockGrant.v1 document; the issuer signs its canonical
// encoding (see pkg/grant, which defines the encoding).
type GrantDocument struct {
	// schema is always lockGrant.v1.
	// +required
	Schema string `json:"schema"`
	// resource is the FencedResource's resourceID.
	// +required
	Resource string `json:"resource"`
	// owner is the holder's identity.
	// +required
	Owner string `json:"owner"`
	// requestID is the holder's idempotency key.
	// +required
	RequestID string `json:"requestID"`
	// lease is the holder's session ID.
	// +required
	Lease string `json:"lease"`
	// operationRoot is the planned operation.
	// +required
	OperationRoot string `json:"operationRoot"`
	// fenceToken is the monotonic fence.
	// +required
	FenceToken int64 `json:"fenceToken"`
	// backendRevision is the registry revision the allocation was conditioned on.
	// +required
	BackendRevision string `json:"backendRevision"`
	// policyGeneration is the FencedResource generation at issue time.
	// +required
	PolicyGeneration int64 `json:"policyGeneration"`
	// issuerEpoch is the issuer epoch.
	// +required
	IssuerEpoch int64 `json:"issuerEpoch"`
	// ttlSeconds is the lease duration.
	// +required
	TTLSeconds int64 `json:"ttlSeconds"`
	// operationCategory is the operation category ("" when none).
	// +required
	OperationCategory string `json:"operationCategory"`
	// issuedAt is the issue time, RFC 3339.
	// +required
	IssuedAt string `json:"issuedAt"`
}

// LockGrantStatus mirrors the registry's decision about this request.
//
// Only the operator writes it, with updates and patches, never an apply:
// atomic, its managedFields entry is one path, not every field and
// condition it holds, which the API server keeps for each object.
// +structType=atomic
type LockGrantStatus struct {
	// phase is Pending, Held, Expired, Released, Revoked or Denied.
	// +optional
	Phase LockGrantPhase `json:"phase,omitempty"`
	// grant is the signed lockGrant.v1 document, set once issued.
	// +optional
	Grant *GrantDocument `json:"grant,omitempty"`
	// digest is sha256:<hex> of the canonical grant.
	// +optional
	Digest string `json:"digest,omitempty"`
	// proof is ed25519:<keyID>:<base64 signature over digest>.
	// +optional
	Proof string `json:"proof,omitempty"`
	// expiresAt is when the grant expires on the issuer's clock unless renewed.
	// +optional
	ExpiresAt *metav1.MicroTime `json:"expiresAt,omitempty"`
	// observedRenewals is the spec.renewals value the issuer last applied.
	// +optional
	ObservedRenewals int64 `json:"observedRenewals,omitempty"`
	// conditions: Issued.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The Expires column below is a string: kubectl shows a future date column
// as <invalid>. (Kept apart from the type's doc, which kubectl explain shows.)

// LockGrant is one acquisition attempt on a FencedResource and, once issued, its signed grant.
// Its name is free, except that a name of the client library's form must be its own (see requestID).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lg,categories=fencekeeper
// +kubebuilder:selectablefield:JSONPath=`.spec.resource`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource`
// +kubebuilder:printcolumn:name="Owner",type=string,JSONPath=`.spec.owner`
// +kubebuilder:printcolumn:name="Fence",type=integer,JSONPath=`.status.grant.fenceToken`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.expiresAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LockGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the request.
	// +required
	Spec LockGrantSpec `json:"spec"`
	// status is the issuer's decision.
	// +optional
	Status LockGrantStatus `json:"status,omitempty"`
}

// LockGrantList contains a list of LockGrant.
// +kubebuilder:object:root=true
type LockGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LockGrant `json:"items"`
}
