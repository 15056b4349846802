package controllers

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Signing-key rotation, in the order the design sets: add the new public key
// to the trust bundle → every verifier trusts it → sign with it → bump the
// issuer epoch → revoke the older epochs → retire the old key. The state of a
// rotation lives in the signing-key Secret (only the operator may write it):
// a staged next key, then the key being retired and the epoch below which
// grants are revoked. Each step is derived from that state, the bundle and
// the verifiers' reports, so an operator restarted at any point carries on.
// A rotation starts when the key-rotation ConfigMap names a request the
// Secret has not served yet; the operator reports progress into it.

// Entries of the signing-key Secret that carry a rotation in progress.
const (
	nextKeyIDKey       = "next.keyID"
	nextKeySeedKey     = "next.ed25519.seed"
	retiringKeyIDKey   = "retiring.keyID"
	revokeBelowKey     = "rotation.revokeBelowEpoch"
	rotationRequestKey = "rotation.request"
)

// rotationPollBackoff is how soon a waiting rotation step looks again.
const rotationPollBackoff = time.Second

// trusts says whether the replica reported keyID among the keys it verifies with.
func trusts(v locksv1.VerifierReport, keyID string) bool {
	for _, k := range v.Keys {
		if k == keyID {
			return true
		}
	}
	return false
}

// rotationState is everything a rotation step is decided from.
type rotationState struct {
	active, next, retiring string // key IDs from the Secret
	nextPub                ed25519.PublicKey
	revokeBelow            int64
	served, requested      string // request the Secret served; request in the ConfigMap
	bundle                 *grant.TrustBundle
	verifiers              []locksv1.VerifierReport
}

// nextRotationStep decides the next step and, for a wait, who is waited on.
// It is pure: the table test covers every branch.
func nextRotationStep(s rotationState) (locksv1.RotationStep, string) {
	switch {
	case s.next != "" && s.retiring != "":
		return locksv1.StepBlocked, fmt.Sprintf("signing-key Secret has both a staged key %q and a retiring key %q", s.next, s.retiring)
	case s.next != "":
		return nextStagedStep(s)
	case s.retiring != "":
		return nextRetiringStep(s)
	case s.requested != "" && s.requested != s.served:
		return locksv1.StepStage, ""
	}
	return locksv1.StepIdle, ""
}

// nextStagedStep: a new key is staged; publish it, then switch once every verifier trusts it.
func nextStagedStep(s rotationState) (locksv1.RotationStep, string) {
	pub, ok := s.bundle.Keys[s.next]
	if !ok {
		return locksv1.StepAddKey, ""
	}
	if !pub.Equal(s.nextPub) {
		return locksv1.StepBlocked, fmt.Sprintf("trust bundle holds key %q with a different public key than the staged one", s.next)
	}
	if lag := verifiersWhere(s.verifiers, func(v locksv1.VerifierReport) bool { return !trusts(v, s.next) }); lag != "" {
		return locksv1.StepAwaitTrust, lag
	}
	return locksv1.StepSwitch, ""
}

// nextRetiringStep: the issuer signs with the new key; revoke, then retire the old key.
func nextRetiringStep(s rotationState) (locksv1.RotationStep, string) {
	if s.bundle.RevokedBelowEpoch < s.revokeBelow {
		return locksv1.StepRevoke, ""
	}
	if lag := verifiersWhere(s.verifiers, func(v locksv1.VerifierReport) bool { return v.RevokedBelow < s.revokeBelow }); lag != "" {
		return locksv1.StepAwaitRevoked, lag
	}
	if _, ok := s.bundle.Keys[s.retiring]; ok {
		return locksv1.StepRetire, ""
	}
	if lag := verifiersWhere(s.verifiers, func(v locksv1.VerifierReport) bool { return trusts(v, s.retiring) }); lag != "" {
		return locksv1.StepAwaitRetired, lag
	}
	return locksv1.StepFinish, ""
}

// verifiersWhere names the live verifiers for which lags holds; with no live
// verifier at all it names that, since nobody has confirmed anything.
func verifiersWhere(vs []locksv1.VerifierReport, lags func(locksv1.VerifierReport) bool) string {
	var names []string
	live := 0
	for _, v := range vs {
		if !v.Live {
			continue
		}
		live++
		if lags(v) {
			names = append(names, v.Replica)
		}
	}
	if live == 0 {
		return "no live verifier has reported (no webhook replica renews a " + locksv1.VerifierLeasePrefix + "* Lease)"
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// keyRotator drives a rotation one step per call.
type keyRotator struct {
	client   client.Client
	reader   client.Reader
	identity *IssuerIdentity
}

// step performs at most one step and reports the state after it; it
// returns whether the rotation is still in progress.
func (k *keyRotator) step(ctx context.Context) (bool, error) {
	i := k.identity
	var sec corev1.Secret
	if err := k.reader.Get(ctx, i.key(locksv1.SigningKeySecret), &sec); err != nil {
		return false, fmt.Errorf("read signing key secret: %w", err)
	}
	var cm corev1.ConfigMap
	if err := k.reader.Get(ctx, i.key(locksv1.TrustBundleConfigMap), &cm); err != nil {
		return false, fmt.Errorf("read trust bundle: %w", err)
	}
	bundle, err := grant.ParseTrustBundle(cm.Data)
	if err != nil {
		return false, err
	}
	var req corev1.ConfigMap
	if err := k.reader.Get(ctx, i.key(locksv1.KeyRotationConfigMap), &req); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("read key rotation request: %w", err)
	}
	verifiers, err := k.verifiers(ctx)
	if err != nil {
		return false, err
	}
	s := rotationState{
		active: string(sec.Data[signingKeyIDKey]), next: string(sec.Data[nextKeyIDKey]), retiring: string(sec.Data[retiringKeyIDKey]),
		served: string(sec.Data[rotationRequestKey]), requested: req.Data[locksv1.RotationRequestKey], bundle: bundle, verifiers: verifiers,
	}
	s.revokeBelow, _ = strconv.ParseInt(string(sec.Data[revokeBelowKey]), 10, 64)
	var next *grant.Signer
	if s.next != "" {
		if next, err = grant.NewSigner(s.next, sec.Data[nextKeySeedKey]); err != nil {
			return false, fmt.Errorf("signing-key Secret: staged key: %w", err)
		}
		s.nextPub = next.PublicKey()
	}
	step, waiting := nextRotationStep(s)
	if err := k.do(ctx, step, s, &sec, &cm, next); err != nil {
		// Reported where a person looks, and retried on the next poll.
		ctrl.LoggerFrom(ctx).Error(err, "key rotation step failed", "step", step)
		waiting = "step failed: " + err.Error()
	}
	k.report(ctx, &req, step, waiting, s)
	return step != locksv1.StepIdle, nil
}

// do performs step; a wait does nothing.
func (k *keyRotator) do(ctx context.Context, step locksv1.RotationStep, s rotationState, sec *corev1.Secret, cm *corev1.ConfigMap, next *grant.Signer) error {
	log := ctrl.LoggerFrom(ctx)
	switch step {
	case locksv1.StepStage:
		signer, err := grant.GenerateSigner(rand.Reader)
		if err != nil {
			return err
		}
		sec.Data[nextKeyIDKey], sec.Data[nextKeySeedKey] = []byte(signer.KeyID()), signer.Seed()
		sec.Data[rotationRequestKey] = []byte(s.requested)
		log.Info("key rotation: staged a new signing key", "keyID", signer.KeyID(), "request", s.requested)
		return k.client.Update(ctx, sec)
	case locksv1.StepAddKey:
		cm.Data[s.next] = base64.StdEncoding.EncodeToString(s.nextPub)
		log.Info("key rotation: added the new public key to the trust bundle", "keyID", s.next)
		return k.client.Update(ctx, cm)
	case locksv1.StepSwitch:
		return k.switchSigner(ctx, s, sec, next)
	case locksv1.StepRevoke:
		cm.Data[grant.RevokedBelowEpochKey] = strconv.FormatInt(s.revokeBelow, 10)
		log.Info("key rotation: revoking grants of older epochs", "revokedBelowEpoch", s.revokeBelow)
		return k.client.Update(ctx, cm)
	case locksv1.StepRetire:
		if err := retireKey(cm, s.retiring); err != nil {
			return err
		}
		log.Info("key rotation: retired the old key from the trust bundle", "keyID", s.retiring)
		return k.client.Update(ctx, cm)
	case locksv1.StepFinish:
		delete(sec.Data, retiringKeyIDKey)
		delete(sec.Data, revokeBelowKey)
		log.Info("key rotation: complete", "keyID", s.active)
		return k.client.Update(ctx, sec)
	}
	return nil
}

// switchSigner bumps the issuer epoch, records the switch in the Secret and
// then signs with the new key under the new epoch. Every grant the old key
// signed carries an older epoch, so revoking below the new one covers them.
func (k *keyRotator) switchSigner(ctx context.Context, s rotationState, sec *corev1.Secret, next *grant.Signer) error {
	epoch, err := k.identity.nextEpoch(ctx)
	if err != nil {
		return err
	}
	sec.Data[signingKeyIDKey], sec.Data[signingKeySeedKey] = []byte(next.KeyID()), next.Seed()
	sec.Data[retiringKeyIDKey] = []byte(s.active)
	sec.Data[revokeBelowKey] = []byte(strconv.FormatInt(epoch, 10))
	delete(sec.Data, nextKeyIDKey)
	delete(sec.Data, nextKeySeedKey)
	if err := k.client.Update(ctx, sec); err != nil {
		return fmt.Errorf("record the switch to key %q: %w", next.KeyID(), err)
	}
	k.identity.switchSigner(next, epoch)
	ctrl.LoggerFrom(ctx).Info("key rotation: signing with the new key under a new issuer epoch", "keyID", next.KeyID(), "epoch", epoch)
	return nil
}

func (k *keyRotator) verifiers(ctx context.Context) ([]locksv1.VerifierReport, error) {
	var leases coordinationv1.LeaseList
	if err := k.reader.List(ctx, &leases, client.InNamespace(k.identity.namespace),
		client.MatchingLabels{locksv1.LabelComponent: locksv1.ComponentVerifier}); err != nil {
		return nil, fmt.Errorf("list verifier leases: %w", err)
	}
	now := time.Now() // leases are renewed on the wall clock
	var out []locksv1.VerifierReport
	for i := range leases.Items {
		if strings.HasPrefix(leases.Items[i].Name, locksv1.VerifierLeasePrefix) {
			out = append(out, locksv1.ParseVerifierLease(&leases.Items[i], now))
		}
	}
	return out, nil
}

// report writes the rotation's progress into the request ConfigMap, if any.
func (k *keyRotator) report(ctx context.Context, req *corev1.ConfigMap, step locksv1.RotationStep, waiting string, s rotationState) {
	if req.Name == "" {
		return
	}
	phase := "InProgress"
	switch {
	case step == locksv1.StepIdle && s.requested != "" && s.requested == s.served:
		phase = "Complete"
	case step == locksv1.StepIdle:
		phase = "Idle"
	case step == locksv1.StepBlocked:
		phase = "Blocked"
	}
	status := map[string]string{
		"phase": phase, "step": string(step), "waitingOn": waiting, "servedRequest": s.served,
		"signingKeyID": k.identity.SigningKeyID(), "newKeyID": s.next, "retiringKeyID": s.retiring,
		"issuerEpoch": strconv.FormatInt(k.identity.Epoch(), 10), "revokeBelowEpoch": strconv.FormatInt(s.revokeBelow, 10),
	}
	changed := false
	if req.Data == nil {
		req.Data = map[string]string{}
	}
	for key, v := range status {
		if req.Data[locksv1.RotationStatusPrefix+key] != v {
			req.Data[locksv1.RotationStatusPrefix+key], changed = v, true
		}
	}
	if !changed {
		return
	}
	if err := k.client.Update(ctx, req); err != nil && !apierrors.IsConflict(err) {
		ctrl.LoggerFrom(ctx).Error(err, "report key rotation progress")
	}
}

// maxRetiredKeys bounds the retired keys the bundle remembers.
const maxRetiredKeys = 8

// retireKey moves keyID from the bundle's keys to its retired keys: it no
// longer authenticates grants, but fence state the webhook accepted under it
// and stored on objects still counts (their receipt logs go on). The oldest
// retired keys are forgotten beyond maxRetiredKeys.
func retireKey(cm *corev1.ConfigMap, keyID string) error {
	retired := map[string]string{}
	if raw := cm.Annotations[locksv1.AnnotationRetiredKeys]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &retired); err != nil {
			return fmt.Errorf("trust bundle annotation %s: %w", locksv1.AnnotationRetiredKeys, err)
		}
	}
	order := strings.Fields(cm.Annotations[retiredOrderAnnotation])
	retired[keyID] = cm.Data[keyID]
	order = append(slices.DeleteFunc(order, func(id string) bool { return id == keyID }), keyID)
	for len(order) > maxRetiredKeys {
		delete(retired, order[0])
		order = order[1:]
	}
	raw, err := json.Marshal(retired)
	if err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[locksv1.AnnotationRetiredKeys] = string(raw)
	cm.Annotations[retiredOrderAnnotation] = strings.Join(order, " ")
	delete(cm.Data, keyID)
	return nil
}

// retiredOrderAnnotation lists the retired key IDs, oldest first.
const retiredOrderAnnotation = locksv1.AnnotationRetiredKeys + "-order"
