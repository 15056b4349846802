package v1alpha1

import (
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// IssuerEpochDataKey is the issuer-epoch record's entry; the trust-anchor
// policy and kubectl fence keys read it too.
const IssuerEpochDataKey = "epoch"

// The signing-key rotation's wire format, shared by the operator that runs it
// and kubectl fence keys that requests and shows it (docs/key-rotation.md).

// Entries of the key-rotation ConfigMap.
const (
	// RotationRequestKey is the request a user writes (any new value asks for one rotation).
	RotationRequestKey = "request"
	// RotationStatusPrefix starts every entry the operator writes.
	RotationStatusPrefix = "status."
)

// RotationStep is where a rotation stands: the next thing to happen.
type RotationStep string

// Rotation steps in order.
const (
	StepIdle         RotationStep = "Idle"
	StepStage        RotationStep = "StageNewKey"
	StepAddKey       RotationStep = "AddKeyToBundle"
	StepAwaitTrust   RotationStep = "AwaitVerifiersTrustNewKey"
	StepSwitch       RotationStep = "SwitchSignerAndBumpEpoch"
	StepRevoke       RotationStep = "RevokeOldEpochs"
	StepAwaitRevoked RotationStep = "AwaitVerifiersRevoked"
	StepRetire       RotationStep = "RetireOldKey"
	StepAwaitRetired RotationStep = "AwaitVerifiersDropOldKey"
	StepFinish       RotationStep = "Finish"
	StepBlocked      RotationStep = "Blocked"
)

// VerifierReport is what one live webhook replica reported it verifies with.
type VerifierReport struct {
	Replica      string
	Keys         []string
	RevokedBelow int64
	Live         bool
}

// ParseVerifierLease reads one verifier's report; now decides liveness.
func ParseVerifierLease(l *coordinationv1.Lease, now time.Time) VerifierReport {
	v := VerifierReport{Replica: strings.TrimPrefix(l.Name, VerifierLeasePrefix)}
	if l.Spec.HolderIdentity != nil {
		v.Replica = *l.Spec.HolderIdentity
	}
	if keys := l.Annotations[AnnotationVerifierKeys]; keys != "" {
		v.Keys = strings.Split(keys, ",")
	}
	v.RevokedBelow, _ = strconv.ParseInt(l.Annotations[AnnotationVerifierRevokedBelow], 10, 64)
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		v.Live = now.Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
	}
	return v
}
