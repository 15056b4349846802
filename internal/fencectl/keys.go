package fencectl

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// rotationSteps are the rotation's steps as people read them, each with the
// operator steps (locksv1.RotationStep) that belong to it.
var rotationSteps = []struct {
	name, does string
	steps      []locksv1.RotationStep
}{
	{"add-key", "generate a new signing key and add its public key to the trust bundle", []locksv1.RotationStep{locksv1.StepStage, locksv1.StepAddKey}},
	{"verifiers-trust-new-key", "wait until every live webhook replica reports that it trusts the new key", []locksv1.RotationStep{locksv1.StepAwaitTrust}},
	{"switch-signer-bump-epoch", "sign new grants with the new key under a new issuer epoch", []locksv1.RotationStep{locksv1.StepSwitch}},
	{"revoke-old-epochs", "raise revokedBelowEpoch to the new epoch (held grants of older epochs are revoked; their waiters get fences above them) and wait until every replica enforces it", []locksv1.RotationStep{locksv1.StepRevoke, locksv1.StepAwaitRevoked}},
	{"retire-old-key", "remove the old public key from the trust bundle and wait until no replica trusts it", []locksv1.RotationStep{locksv1.StepRetire, locksv1.StepAwaitRetired, locksv1.StepFinish}},
}

// keysView is kubectl fence keys status.
type keysView struct {
	Namespace         string         `json:"namespace"`
	TrustedKeys       []string       `json:"trustedKeys"`
	RevokedBelowEpoch int64          `json:"revokedBelowEpoch"`
	IssuerEpoch       int64          `json:"issuerEpoch"`
	Rotation          rotationView   `json:"rotation"`
	Steps             []stepView     `json:"steps"`
	Verifiers         []verifierView `json:"verifiers"`
}

type rotationView struct {
	Phase            string `json:"phase"`
	Step             string `json:"step,omitempty"`
	WaitingOn        string `json:"waitingOn,omitempty"`
	Request          string `json:"request,omitempty"`
	ServedRequest    string `json:"servedRequest,omitempty"`
	SigningKeyID     string `json:"signingKeyID,omitempty"`
	NewKeyID         string `json:"newKeyID,omitempty"`
	RetiringKeyID    string `json:"retiringKeyID,omitempty"`
	RevokeBelowEpoch string `json:"revokeBelowEpoch,omitempty"`
}

type stepView struct {
	Name  string `json:"name"`
	State string `json:"state"` // done, current, pending
	Does  string `json:"does"`
}

type verifierView struct {
	Replica           string    `json:"replica"`
	Keys              []string  `json:"keys"`
	RevokedBelowEpoch int64     `json:"revokedBelowEpoch"`
	Live              bool      `json:"live"`
	RenewedAt         time.Time `json:"renewedAt,omitempty"`
}

func (o *options) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Show and rotate the issuer's signing key (see docs/key-rotation.md)",
		Example: `  kubectl fence keys status
  kubectl fence keys rotate --dry-run`,
	}
	cmd.AddCommand(o.keysStatusCmd(), o.keysRotateCmd())
	return cmd
}

func (o *options) operatorNamespaceFlag(cmd *cobra.Command, ns *string) {
	cmd.Flags().StringVar(ns, "operator-namespace", locksv1.DefaultNamespace, "Namespace fencekeeper is installed in")
}

func (o *options) keysStatusCmd() *cobra.Command {
	var opNS string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the trusted keys, the epochs, a rotation's steps and which verifier trusts which key",
		Example: `  # Trusted keys, epochs, where a rotation stands and what each webhook replica trusts
  kubectl fence keys status

  # The operator installed in another namespace, as YAML
  kubectl fence keys status --operator-namespace fencekeeper -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := o.loadKeys(cmd.Context(), opNS)
			if err != nil {
				return err
			}
			return o.emit(v, nil, func(bool) error { o.printKeys(v); return nil })
		},
	}
	o.operatorNamespaceFlag(cmd, &opNS)
	o.addOutputFlags(cmd)
	return cmd
}

func (o *options) keysRotateCmd() *cobra.Command {
	var (
		opNS    string
		dryRun  bool
		wait    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Ask the operator to rotate the signing key, in the design's order",
		Long: `rotate asks the fencekeeper operator to rotate its signing key. Only the
operator's identity may change the trust bundle; this command writes a
request into the ConfigMap ` + locksv1.KeyRotationConfigMap + ` and the
operator carries it out step by step. Asking needs, besides writing that
ConfigMap, the verb rotate on trustanchors.locks.fencekeeper.dev named
` + locksv1.KeyRotationConfigMap + ` in the operator namespace (the admission
policy there checks it):

  1. add-key                   new key generated, public key added to the bundle
  2. verifiers-trust-new-key   every live webhook replica reports the new key
  3. switch-signer-bump-epoch  new grants signed with the new key, new issuer epoch
  4. revoke-old-epochs         revokedBelowEpoch raised to the new epoch
  5. retire-old-key            old key removed; no replica trusts it any more

Held grants of older epochs are revoked at step 4; their holders must
acquire again and get fences above every fence issued so far.
--dry-run prints the plan and checks the request would be accepted,
without changing anything. --wait follows the steps until the rotation is
complete. See docs/key-rotation.md.`,
		Example: `  # The plan, and whether you may ask for it (a server-side dry run): nothing changes
  kubectl fence keys rotate --dry-run

  # Rotate and follow the steps until the rotation is complete
  kubectl fence keys rotate --wait --timeout 10m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.rotate(cmd.Context(), opNS, dryRun, wait, timeout)
		},
	}
	o.operatorNamespaceFlag(cmd, &opNS)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "Print the plan and check the request (server-side dry run) without requesting a rotation")
	cmd.Flags().BoolVar(&wait, "wait", false, "Follow the rotation until it is complete")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "How long --wait waits")
	return cmd
}

func (o *options) rotate(ctx context.Context, opNS string, dryRun, wait bool, timeout time.Duration) error {
	v, err := o.loadKeys(ctx, opNS)
	if err != nil {
		return err
	}
	if r := v.Rotation; r.Phase == "InProgress" || r.Phase == "Blocked" || (r.Request != "" && r.Request != r.ServedRequest) {
		return fmt.Errorf("a rotation is already requested or in progress (phase %s, step %s, request %q); follow it with kubectl fence keys status",
			r.Phase, r.Step, r.Request)
	}
	kube, err := o.kube()
	if err != nil {
		return err
	}
	request := time.Now().UTC().Format(time.RFC3339Nano)
	var opts []client.CreateOption
	if dryRun {
		o.printPlan(v)
		opts = append(opts, client.DryRunAll)
	}
	if err := writeRotationRequest(ctx, kube, opNS, request, opts...); err != nil {
		return fmt.Errorf("request the rotation in configmap %s/%s: %w", opNS, locksv1.KeyRotationConfigMap, err)
	}
	if dryRun {
		o.printf("\nDry run: the request would be accepted; nothing was changed.\n")
		return nil
	}
	o.printf("rotation requested (request %s); follow it with: kubectl fence keys status\n", request)
	if !wait {
		return nil
	}
	return o.waitRotation(ctx, opNS, request, timeout)
}

// writeRotationRequest creates the request ConfigMap or sets its request entry.
func writeRotationRequest(ctx context.Context, kube client.Client, ns, request string, opts ...client.CreateOption) error {
	var dry []client.UpdateOption
	if len(opts) > 0 {
		dry = append(dry, client.DryRunAll)
	}
	for {
		var cm corev1.ConfigMap
		err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: locksv1.KeyRotationConfigMap}, &cm)
		if apierrors.IsNotFound(err) {
			cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: locksv1.KeyRotationConfigMap},
				Data: map[string]string{locksv1.RotationRequestKey: request}}
			if err := kube.Create(ctx, &cm, opts...); !apierrors.IsAlreadyExists(err) {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[locksv1.RotationRequestKey] = request
		if err := kube.Update(ctx, &cm, dry...); !apierrors.IsConflict(err) {
			return err
		}
	}
}

func (o *options) waitRotation(ctx context.Context, opNS, request string, timeout time.Duration) error {
	limit, flag, err := o.waitLimit(timeout)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	last := ""
	for {
		v, err := o.loadKeys(ctx, opNS)
		if err != nil {
			return err
		}
		r := v.Rotation
		if r.ServedRequest == request && r.Phase == "Complete" {
			o.printf("rotation complete: signing with %s, trusted keys %s, revokedBelowEpoch %d\n",
				r.SigningKeyID, strings.Join(v.TrustedKeys, ","), v.RevokedBelowEpoch)
			return nil
		}
		if now := r.Step + " " + r.WaitingOn; now != last {
			o.printf("%s  step %s%s\n", time.Now().Format(time.TimeOnly), r.Step, waitingSuffix(r.WaitingOn))
			last = now
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rotation not complete after %s (%s): at step %s%s; see docs/key-rotation.md, \"When a rotation is stuck\"",
				limit, flag, r.Step, waitingSuffix(r.WaitingOn))
		}
		if err := ctxtime.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

func waitingSuffix(w string) string {
	if w == "" {
		return ""
	}
	return " (waiting on " + w + ")"
}

// loadKeys reads the public state of the keys: the trust bundle, the epoch
// record, the rotation request and the verifiers' Leases. It never reads
// the signing-key Secret (whoever reads it can forge grants).
func (o *options) loadKeys(ctx context.Context, ns string) (keysView, error) {
	v := keysView{Namespace: ns}
	kube, err := o.kube()
	if err != nil {
		return v, err
	}
	var bundleCM, epochCM, req corev1.ConfigMap
	if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: locksv1.TrustBundleConfigMap}, &bundleCM); err != nil {
		return v, explainAPI(err, "trust bundle ConfigMap "+ns+"/"+locksv1.TrustBundleConfigMap)
	}
	bundle, err := grant.ParseTrustBundle(bundleCM.Data)
	if err != nil {
		return v, err
	}
	v.TrustedKeys, v.RevokedBelowEpoch = bundle.KeyIDs(), bundle.RevokedBelowEpoch
	if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: locksv1.IssuerEpochConfigMap}, &epochCM); err == nil {
		v.IssuerEpoch, _ = strconv.ParseInt(epochCM.Data[locksv1.IssuerEpochDataKey], 10, 64)
	}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: locksv1.KeyRotationConfigMap}, &req); client.IgnoreNotFound(err) != nil {
		return v, explainAPI(err, "key rotation ConfigMap "+ns+"/"+locksv1.KeyRotationConfigMap)
	}
	s := func(k string) string { return req.Data[locksv1.RotationStatusPrefix+k] }
	v.Rotation = rotationView{Phase: s("phase"), Step: s("step"), WaitingOn: s("waitingOn"), Request: req.Data[locksv1.RotationRequestKey],
		ServedRequest: s("servedRequest"), SigningKeyID: s("signingKeyID"), NewKeyID: s("newKeyID"), RetiringKeyID: s("retiringKeyID"),
		RevokeBelowEpoch: s("revokeBelowEpoch")}
	if v.Rotation.Phase == "" {
		v.Rotation.Phase = "Idle"
	}
	v.Steps = stepsOf(v.Rotation)
	var leases coordinationv1.LeaseList
	if err := kube.List(ctx, &leases, client.InNamespace(ns), client.MatchingLabels{locksv1.LabelComponent: locksv1.ComponentVerifier}); err != nil {
		return v, explainAPI(err, "verifier Leases in "+ns)
	}
	now := time.Now()
	for i := range leases.Items {
		l := &leases.Items[i]
		if !strings.HasPrefix(l.Name, locksv1.VerifierLeasePrefix) {
			continue
		}
		r := locksv1.ParseVerifierLease(l, now)
		vv := verifierView{Replica: r.Replica, Keys: r.Keys, RevokedBelowEpoch: r.RevokedBelow, Live: r.Live}
		if l.Spec.RenewTime != nil {
			vv.RenewedAt = l.Spec.RenewTime.Time
		}
		v.Verifiers = append(v.Verifiers, vv)
	}
	sort.Slice(v.Verifiers, func(i, j int) bool { return v.Verifiers[i].Replica < v.Verifiers[j].Replica })
	return v, nil
}

// stepsOf marks each step done, current or pending from the operator's step.
func stepsOf(r rotationView) []stepView {
	current := -1
	for i, s := range rotationSteps {
		for _, st := range s.steps {
			if string(st) == r.Step {
				current = i
			}
		}
	}
	out := make([]stepView, 0, len(rotationSteps))
	for i, s := range rotationSteps {
		state := "pending"
		switch {
		case r.Phase == "Complete" || (current >= 0 && i < current):
			state = "done"
		case i == current:
			state = "current"
		}
		out = append(out, stepView{Name: s.name, State: state, Does: s.does})
	}
	return out
}

func (o *options) printKeys(v keysView) {
	o.printf("Namespace:          %s\n", v.Namespace)
	o.printf("Trusted keys:       %s\n", strings.Join(v.TrustedKeys, ", "))
	o.printf("Issuer epoch:       %d\n", v.IssuerEpoch)
	o.printf("revokedBelowEpoch:  %d\n", v.RevokedBelowEpoch)
	r := v.Rotation
	o.printf("Rotation:           %s", r.Phase)
	if r.Step != "" && r.Phase != "Complete" && r.Phase != "Idle" {
		o.printf(" at %s%s", r.Step, waitingSuffix(r.WaitingOn))
	}
	o.printf("\n")
	if r.SigningKeyID != "" {
		o.printf("Signing key:        %s\n", r.SigningKeyID)
	}
	if r.NewKeyID != "" || r.RetiringKeyID != "" {
		o.printf("New key:            %s\nRetiring key:       %s\n", r.NewKeyID, r.RetiringKeyID)
	}
	o.printf("\nSTEPS\n")
	tw := o.table("#", "STEP", "STATE", "WHAT IT DOES")
	for i, s := range v.Steps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", i+1, s.Name, s.State, s.Does)
	}
	_ = tw.Flush()
	o.printf("\nVERIFIERS\n")
	tw = o.table("REPLICA", "LIVE", "TRUSTED KEYS", "REVOKED BELOW", "RENEWED")
	for _, vv := range v.Verifiers {
		fmt.Fprintf(tw, "%s\t%t\t%s\t%d\t%s\n", vv.Replica, vv.Live, strings.Join(vv.Keys, ","), vv.RevokedBelowEpoch, until(vv.RenewedAt))
	}
	_ = tw.Flush()
}

func (o *options) printPlan(v keysView) {
	o.printKeys(v)
	live := 0
	for _, vv := range v.Verifiers {
		if vv.Live {
			live++
		}
	}
	o.printf("\nPLAN\n")
	for i, s := range rotationSteps {
		o.printf("  %d. %s: %s\n", i+1, s.name, s.does)
	}
	o.printf("\nThe rotation waits on %d live verifier(s); replicas that stopped reporting are not waited on.\n", live)
	if live == 0 {
		o.printf("WARNING: no live verifier reports; the rotation will stop at verifiers-trust-new-key until one does.\n")
	}
	o.printf("Held grants of epochs below the new issuer epoch will be revoked at step 4.\n")
}
