package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnforcementMode says what the admission webhook does with a write that fails the fence checks.
// +kubebuilder:validation:Enum=Shadow;Enforce
type EnforcementMode string

const (
	// EnforcementShadow allows the write and returns a "would deny" warning.
	EnforcementShadow EnforcementMode = "Shadow"
	// EnforcementEnforce denies the write.
	EnforcementEnforce EnforcementMode = "Enforce"
)

// Condition types of a FencedResource.
const (
	// ConditionReady is True when the issuer can issue grants for the resource.
	ConditionReady = "Ready"
	// ConditionHeld is True while a grant is held.
	ConditionHeld = "Held"
	// ConditionFenceRegression is True when the registry went behind the fence seen at the target.
	ConditionFenceRegression = "FenceRegression"
	// ConditionReconciliationRequired is True when a mutation outcome could not be determined.
	ConditionReconciliationRequired = "ReconciliationRequired"
	// ConditionStoresPublished is True while every store in spec.stores
	// takes what the operator publishes; absent without stores.
	ConditionStoresPublished = "StoresPublished"
)

// Reasons of a store's status (status.stores) and of the StoresPublished
// condition.
const (
	// ReasonStorePublished: the store has the registry's current holder (or
	// nothing held) and the end of every other grant.
	ReasonStorePublished = "Published"
	// ReasonStoreSecretNotFound: the Secret, or its DSN key, is missing.
	ReasonStoreSecretNotFound = "SecretNotFound"
	// ReasonStoreUnreachable: no connection to the store.
	ReasonStoreUnreachable = "StoreUnreachable"
	// ReasonStoreSchemaNotInstalled: the fencekeeper schema is not in the
	// database (kubectl fence pg install).
	ReasonStoreSchemaNotInstalled = "SchemaNotInstalled"
	// ReasonStorePublishFailed: the store refused a publication (a DSN that
	// does not parse, a role without the operator's grants, ...).
	ReasonStorePublishFailed = "PublishFailed"
)

// MaxStores bounds spec.stores.
const MaxStores = 8

// Condition reasons of a FencedResource.
const (
	ReasonIssuing          = "Issuing"
	ReasonEpochRevoked     = "IssuerEpochRevoked"
	ReasonHolderActive     = "GrantHeld"
	ReasonNoHolder         = "NoHolder"
	ReasonRegressionFound  = "RegistryBehindTarget"
	ReasonFloorAboveTarget = "FenceFloorAboveTarget"
	// ReasonUnresolvedMutation: a LockGrant records a write whose outcome stayed
	// unknown past UnresolvedMutationDeadline.
	ReasonUnresolvedMutation = "UnresolvedMutation"
	// ReasonNoUnresolvedMutation: no overdue unknown outcome remains.
	ReasonNoUnresolvedMutation = "NoUnresolvedMutation"
	// ReasonUnreadableMutationRecord (with status False): a LockGrant carries
	// an unresolved-mutation annotation that is not a record. No client wrote
	// it for a write, so it is ignored (and does not keep its LockGrant from
	// being collected); the condition and one Event say so.
	ReasonUnreadableMutationRecord = "UnreadableMutationRecord"
)

// ObjectTarget names the in-cluster object, in the FencedResource's namespace, that the entry protects.
type ObjectTarget struct {
	// apiVersion of the protected object, e.g. "v1" or "billing.example.com/v1".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIVersion string `json:"apiVersion"`
	// kind of the protected object, e.g. "ConfigMap".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// name of the protected object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// FencedResourceSpec is the registry policy of one resource.
// +kubebuilder:validation:XValidation:rule="has(self.target) == has(oldSelf.target)",message="target is immutable"
type FencedResourceSpec struct {
	// resourceID is the canonical resource ID bound into every grant, e.g. "invoice-batch/2026-07-19".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="resourceID must be at most 253 bytes of UTF-8 (a signed grant field)"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="resourceID is immutable"
	ResourceID string `json:"resourceID"`

	// target is the object this entry protects; it lives in the same namespace.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="target is immutable"
	Target *ObjectTarget `json:"target,omitempty"`

	// leaseDurationSeconds is the server-side TTL of grants, judged by the issuer's clock.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	LeaseDurationSeconds int32 `json:"leaseDurationSeconds"`

	// allowedOwners lists the identities (Kubernetes usernames) that may claim the resource; empty allows any authenticated user.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(v, size(bytes(v)) <= 253)",message="every allowedOwners entry must be at most 253 bytes of UTF-8 (a signed grant field)"
	AllowedOwners []string `json:"allowedOwners,omitempty"`

	// operationCategories lists the allowed operationCategory values; empty allows any.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(v, size(bytes(v)) <= 253)",message="every operationCategories entry must be at most 253 bytes of UTF-8 (a signed grant field)"
	OperationCategories []string `json:"operationCategories,omitempty"`

	// enforcement is Shadow (warn) or Enforce (deny). Shadow may become Enforce; Enforce never goes back.
	// +optional
	// +kubebuilder:default=Shadow
	// +kubebuilder:validation:XValidation:rule="self == oldSelf || oldSelf == 'Shadow'",message="enforcement may go from Shadow to Enforce only: resource-side validation is never disabled once enforced"
	Enforcement EnforcementMode `json:"enforcement,omitempty"`

	// fenceFloor makes the next fence issued greater than max(status.fenceToken, fenceFloor).
	// It may only grow; raising it is the controlled way out of a fence regression or a trust-bundle rotation.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4611686018427387904
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="fenceFloor may only grow"
	FenceFloor int64 `json:"fenceFloor,omitempty"`

	// stores names the PostgreSQL databases that fence writes of this
	// resource too: the operator publishes every grant, its renewals and
	// its end there (docs/postgres.md). Each is a Secret in this namespace
	// holding the operator's DSN.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Stores []StoreReference `json:"stores,omitempty"`
}

// StoreReference names a database store and the Secret holding the DSN the
// operator publishes with.
type StoreReference struct {
	// name identifies the store in status.stores and in Events (a DNS label).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 63",message="a store name must be at most 63 bytes (a DNS label)"
	Name string `json:"name"`
	// secretRef is the Secret, in the FencedResource's namespace, holding the DSN.
	// +required
	SecretRef StoreSecretReference `json:"secretRef"`
}

// StoreSecretReference is a key of a Secret in the FencedResource's namespace.
type StoreSecretReference struct {
	// name of the Secret (a DNS subdomain).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="a Secret name must be at most 253 bytes (a DNS subdomain)"
	Name string `json:"name"`
	// key of the Secret holding a libpq DSN (keyword/value or URL) for the
	// operator's database role; "dsn" when empty.
	// +optional
	// +kubebuilder:default=dsn
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 253",message="a Secret key must be at most 253 bytes"
	Key string `json:"key,omitempty"`
}

// DefaultStoreSecretKey is the Secret key a store's DSN is read from when
// secretRef.key is empty.
const DefaultStoreSecretKey = "dsn"

// DSNKey is the Secret key holding the DSN.
func (r StoreSecretReference) DSNKey() string {
	if r.Key == "" {
		return DefaultStoreSecretKey
	}
	return r.Key
}

// StoreStatus is what the operator last published to a store, and the
// store's health. It is written when it changes (a new holder published, a
// store failing or recovering), never for a renewal.
type StoreStatus struct {
	// name is the store's name in spec.stores.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// publishedFence is the fence of the holder last published there (0: none yet).
	// +optional
	PublishedFence int64 `json:"publishedFence,omitempty"`
	// publishedDigest is the digest of the holder last published there.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	PublishedDigest string `json:"publishedDigest,omitempty"`
	// lastPublishTime is when the store last took a publication that
	// changed what it holds (a new holder, or the end of every grant).
	// +optional
	LastPublishTime *metav1.Time `json:"lastPublishTime,omitempty"`
	// reason is a CamelCase word: Published, SecretNotFound,
	// StoreUnreachable, SchemaNotInstalled or PublishFailed.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// message says what happened and what to do.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// Holder is the registry's record of the current grant. It is the source of
// truth: the grant document, digest and proof are written here in the same
// compare-and-swap that allocates the fence, and LockGrant status mirrors it.
type Holder struct {
	// grantName is the LockGrant that holds the resource.
	// +required
	GrantName string `json:"grantName"`
	// grantUID is that LockGrant's UID, so a re-created object of the same name is not mistaken for the holder.
	// +required
	GrantUID string `json:"grantUID"`
	// owner is the holder's identity.
	// +required
	Owner string `json:"owner"`
	// lease is the holder's session ID.
	// +required
	Lease string `json:"lease"`
	// requestID is the holder's idempotency key.
	// +required
	RequestID string `json:"requestID"`
	// fenceToken is the fence issued to the holder.
	// +required
	FenceToken int64 `json:"fenceToken"`
	// operationRoot is the holder's planned operation, sha256:<hex>.
	// +required
	OperationRoot string `json:"operationRoot"`
	// operationCategory is the holder's operation category.
	// +optional
	OperationCategory string `json:"operationCategory,omitempty"`
	// issuerEpoch is the epoch the grant was issued under.
	// +required
	IssuerEpoch int64 `json:"issuerEpoch"`
	// policyGeneration is metadata.generation at issue time.
	// +required
	PolicyGeneration int64 `json:"policyGeneration"`
	// backendRevision is the registry revision the allocation was conditioned on.
	// +required
	BackendRevision string `json:"backendRevision"`
	// ttlSeconds is the lease duration signed into the grant.
	// +required
	TTLSeconds int64 `json:"ttlSeconds"`
	// issuedAt is the issue time exactly as signed (RFC 3339).
	// +required
	IssuedAt string `json:"issuedAt"`
	// expiresAt is when the grant expires on the issuer's clock unless renewed.
	// +required
	ExpiresAt metav1.MicroTime `json:"expiresAt"`
	// observedRenewals is the LockGrant spec.renewals value last applied.
	// +optional
	ObservedRenewals int64 `json:"observedRenewals,omitempty"`
	// digest is the grant's sha256 digest.
	// +required
	Digest string `json:"digest"`
	// proof is the issuer's Ed25519 signature over the digest.
	// +required
	Proof string `json:"proof"`
}

// QueuedGrant is one waiter in the FIFO queue.
type QueuedGrant struct {
	// grantName is the waiting LockGrant.
	// +required
	GrantName string `json:"grantName"`
	// owner is the waiter's identity.
	// +required
	Owner string `json:"owner"`
	// grantUID is the waiting LockGrant's UID, recorded by the issuer once a
	// read around its cache confirmed that this LockGrant was never granted.
	// Only the compare-and-swap that issues it removes it from the queue, so
	// while it is queued under this UID it still was never granted, and the
	// head is issued without reading it again (that read was on the handoff's
	// critical path). An entry without it is confirmed when it is issued.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	GrantUID string `json:"grantUID,omitempty"`
}

// QuarantineRecord is one quarantined write attempt (same segment, different payload).
type QuarantineRecord struct {
	// time the attempt was seen.
	// +required
	Time metav1.Time `json:"time"`
	// user who made the attempt.
	// +required
	User string `json:"user"`
	// fence of the attempt.
	// +required
	Fence int64 `json:"fence"`
	// segment of the attempt.
	// +required
	Segment int64 `json:"segment"`
	// operation of the attempt.
	// +optional
	Operation string `json:"operation,omitempty"`
	// payload digest of the attempt.
	// +required
	Payload string `json:"payload"`
	// acceptedPayload is the digest accepted earlier for the same segment.
	// +optional
	AcceptedPayload string `json:"acceptedPayload,omitempty"`
}

// MaxQueueLength bounds status.queue; waiters beyond it stay Pending until there is room.
const MaxQueueLength = 256

// MaxRecentlyEnded bounds status.recentlyEnded.
const MaxRecentlyEnded = 16

// EndedGrant is a grant the registry ended, kept so that its LockGrant is
// never taken for a request still waiting.
type EndedGrant struct {
	// grantUID is the ended grant's LockGrant UID.
	// +required
	// +kubebuilder:validation:MaxLength=128
	GrantUID string `json:"grantUID"`
	// phase is how it ended: Expired, Released or Revoked.
	// +required
	// +kubebuilder:validation:Enum=Expired;Released;Revoked
	Phase LockGrantPhase `json:"phase"`
	// reason is why, as the LockGrant's Issued condition says it.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
}

// FencedResourceStatus is the registry state of the resource.
//
// Only the operator writes it, with updates and patches, never an apply:
// atomic, its managedFields entry is one path, not every field and
// condition it holds, which the API server keeps for each object.
// +structType=atomic
type FencedResourceStatus struct {
	// fenceToken is the highest fence ever issued for the resource; it never decreases.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="fenceToken never decreases"
	FenceToken int64 `json:"fenceToken,omitempty"`
	// holder is the current grant, if any.
	// +optional
	Holder *Holder `json:"holder,omitempty"`
	// queue lists the waiting LockGrants in arrival order.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Queue []QueuedGrant `json:"queue,omitempty"`
	// recentlyEnded lists the last grants the registry ended (newest last),
	// each written by the compare-and-swap that ended it. The LockGrant
	// status mirror follows the registry and can be lost with a crash (or,
	// for a short critical section, never have shown Held): a LockGrant named
	// here is ended whatever its status says, and never queued or issued again.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	RecentlyEnded []EndedGrant `json:"recentlyEnded,omitempty"`
	// backendRevision is the registry revision the last fence allocation was conditioned on.
	// +optional
	BackendRevision string `json:"backendRevision,omitempty"`
	// policyGeneration is the metadata.generation the status was computed from.
	// +optional
	PolicyGeneration int64 `json:"policyGeneration,omitempty"`
	// issuerEpoch is the highest issuer epoch that wrote this status.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="issuerEpoch never decreases"
	IssuerEpoch int64 `json:"issuerEpoch,omitempty"`
	// highestObservedFence is the highest fence seen at the target.
	// +optional
	HighestObservedFence int64 `json:"highestObservedFence,omitempty"`
	// quarantine lists recent quarantined write attempts (newest last, bounded).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Quarantine []QuarantineRecord `json:"quarantine,omitempty"`
	// deletedTarget is the last accepted fence state of the target when its
	// holder deleted it (a declared delete), so that the holder re-creating
	// it continues with the next segment instead of a false FENCE_REGRESSION.
	// Written only by the acceptance webhook.
	// +optional
	DeletedTarget *DeletedTarget `json:"deletedTarget,omitempty"`
	// stores is the publication health of each store in spec.stores.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Stores []StoreStatus `json:"stores,omitempty"`
	// conditions: Ready, Held, FenceRegression, ReconciliationRequired, StoresPublished.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Key is the target's TargetKey.
func (t *ObjectTarget) Key() string {
	group := ""
	if i := strings.LastIndex(t.APIVersion, "/"); i >= 0 {
		group = t.APIVersion[:i]
	}
	return TargetKey(group, t.Kind, t.Name)
}

// DeletedTarget is the fence state a target held when it was deleted.
type DeletedTarget struct {
	// fenceToken, operationRoot and segment are the last accepted segment's.
	FenceToken    int64  `json:"fenceToken"`
	OperationRoot string `json:"operationRoot"`
	Segment       int64  `json:"segment"`
	// grantDigest is the digest of the grant that deleted the target.
	GrantDigest string `json:"grantDigest"`
	// uid is the deleted object's uid.
	// +optional
	UID string `json:"uid,omitempty"`
	// deletedAt is when the acceptance webhook admitted the deletion.
	DeletedAt metav1.Time `json:"deletedAt"`
}

// The Expires column below is a string: kubectl shows a future date column
// as <invalid>. (Kept apart from the type's doc, which kubectl explain shows.)

// FencedResource is the canonical registry entry of one protected resource:
// its lease policy, its monotonic fence and its current holder.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fr,categories=fencekeeper
// +kubebuilder:selectablefield:JSONPath=`.spec.target.name`
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resourceID`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.owner`
// +kubebuilder:printcolumn:name="Fence",type=integer,JSONPath=`.status.fenceToken`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.holder.expiresAt`
// +kubebuilder:printcolumn:name="Enforcement",type=string,JSONPath=`.spec.enforcement`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FencedResource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the resource's lease policy.
	// +required
	Spec FencedResourceSpec `json:"spec"`
	// status is the registry state.
	// +optional
	Status FencedResourceStatus `json:"status,omitempty"`
}

// FencedResourceList contains a list of FencedResource.
// +kubebuilder:object:root=true
type FencedResourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FencedResource `json:"items"`
}
