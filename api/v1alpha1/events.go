package v1alpha1

// Event reasons. Every Event the operator records has a CamelCase reason
// from this block or one of the LockGrant and FencedResource condition
// reasons above (the issuer's Events about a grant that ended); a verdict
// code such as STALE_OWNER travels in the Event's note, which starts with
// it, never as the reason. EventReasons lists them all, so that a test keeps
// them CamelCase and docs/monitoring.md can be checked against it.
const (
	// EventReasonWriteDenied: the acceptance webhook refused a write of an
	// Enforce target; the note starts with the verdict code.
	EventReasonWriteDenied = "WriteDenied"
	// EventReasonWriteQuarantined: the same segment arrived again with other
	// content (verdict QUARANTINED) and was recorded in status.quarantine.
	EventReasonWriteQuarantined = "WriteQuarantined"
	// EventReasonNamespaceTeardown: the namespace controller deleted a
	// protected object while its namespace terminates (on the Namespace).
	EventReasonNamespaceTeardown = "NamespaceTeardown"
	// EventReasonBreakGlass: an override of LockGrant ownership was admitted.
	EventReasonBreakGlass = "BreakGlass"
	// EventReasonNamespaceDeletion: the namespace controller changed or
	// deleted a LockGrant while its namespace terminates.
	EventReasonNamespaceDeletion = "NamespaceDeletion"
	// EventReasonLeaseExtended: a new issuer epoch extended a held lease.
	EventReasonLeaseExtended = "LeaseExtended"
	// EventReasonWebhookConfigurationDrift: the operator wrote its webhook
	// configuration back after a change.
	EventReasonWebhookConfigurationDrift = "WebhookConfigurationDrift"
	// EventReasonWebhookConfigurationAdopted: an operator of a newer webhook
	// shape generation rewrote a configuration of an older one.
	EventReasonWebhookConfigurationAdopted = "WebhookConfigurationAdopted"
	// EventReasonTrustAnchorPolicyDrift: the operator restored its
	// trust-anchor admission policy or binding.
	EventReasonTrustAnchorPolicyDrift = "TrustAnchorPolicyDrift"
	// EventReasonNamespaceExempt: the operator removed the enrollment label
	// from an exempt namespace (on the Namespace).
	EventReasonNamespaceExempt = "NamespaceExempt"
	// EventReasonStorePublishFailed: a store in spec.stores stopped taking
	// what the operator publishes (once per failure, not per retry).
	EventReasonStorePublishFailed = "StorePublishFailed"
	// EventReasonStoreRecovered: a failing store takes publications again.
	EventReasonStoreRecovered = "StoreRecovered"
)

// EventReasons are every reason an operator Event may carry.
var EventReasons = []string{
	EventReasonWriteDenied, EventReasonWriteQuarantined, EventReasonNamespaceTeardown, EventReasonBreakGlass,
	EventReasonNamespaceDeletion, EventReasonLeaseExtended, EventReasonWebhookConfigurationDrift,
	EventReasonWebhookConfigurationAdopted, EventReasonTrustAnchorPolicyDrift, EventReasonNamespaceExempt,
	EventReasonStorePublishFailed, EventReasonStoreRecovered,
	// The issuer's Events about a grant whose holder ended, and the
	// reconciliation controller's.
	ReasonExpired, ReasonDeleted, ReasonRevoked, ReasonPolicyChanged, ReasonNoSuchResource,
	ConditionReconciliationRequired, ReasonNoUnresolvedMutation, ReasonUnreadableMutationRecord,
}
