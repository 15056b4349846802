package envtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// The signing-key rotation runs under the trust-anchor admission policy, so
// every change the operator makes passes the same gate that stops everybody
// else. The policy is removed afterwards, as in the anchors specs: other
// specs reset revokedBelowEpoch as cluster-admin.
var _ = Describe("signing-key rotation", Ordered, func() {
	var (
		nsAdmin    client.Client // may edit every ConfigMap and Secret of the operator namespace
		breakGlass client.Client // also holds the break-glass verb on trustanchors
		opClient   client.Client
		stopGuard  func()
	)

	BeforeAll(func() {
		nsAdmin = userWithRole("rotation-admin",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"*"}})
		breakGlass = userWithRole("rotation-breakglass",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}},
			rbacv1.PolicyRule{APIGroups: []string{locksv1.GroupVersion.Group}, Resources: []string{"trustanchors"}, Verbs: []string{"rotate"}})
		var err error
		opClient, err = client.New(opCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		stopGuard = startGuard(suiteKinds)
		Eventually(func() error {
			return setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, "k-probe", randomPublicKey(), client.DryRunAll)
		}).Should(notOperator)
	})

	AfterAll(func() {
		if stopGuard != nil {
			stopGuard()
		}
		removeTrustAnchorPolicy(nsAdmin)
		Expect(client.IgnoreNotFound(admin.Delete(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.KeyRotationConfigMap)}))).To(Succeed())
	})

	It("lets no identity but the operator add, change or remove a trusted key", func() {
		before := anchorConfigMap(locksv1.TrustBundleConfigMap)
		active := primary.issuer.SigningKeyID()
		Expect(before.Data).To(HaveKey(active))

		err := setAnchorData(nsAdmin, locksv1.TrustBundleConfigMap, "k-intruder", randomPublicKey())
		Expect(err).To(notOperator)
		AddReportEntry("namespace admin adds a key", err.Error())
		err = setAnchorData(breakGlass, locksv1.TrustBundleConfigMap, "k-intruder", randomPublicKey())
		Expect(err).To(notOperator)
		AddReportEntry("break-glass rotator adds a key", err.Error())
		Expect(setAnchorData(breakGlass, locksv1.TrustBundleConfigMap, active, randomPublicKey())).To(notOperator)
		Expect(update(breakGlass, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)}, func(cm *corev1.ConfigMap) {
			delete(cm.Data, active)
		})).To(notOperator)
		Expect(admin.Create(suiteCtx, &corev1.ConfigMap{ObjectMeta: objectMeta(opNamespace, locksv1.TrustBundleConfigMap)}, client.DryRunAll)).
			To(Or(notOperator, WithTransform(apierrors.IsAlreadyExists, BeTrue())))
		// The operator passes the gate (a dry run: the operator adds keys only in a rotation).
		Expect(setAnchorData(opClient, locksv1.TrustBundleConfigMap, "k-intruder", randomPublicKey(), client.DryRunAll)).To(Succeed())

		after := anchorConfigMap(locksv1.TrustBundleConfigMap)
		Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
		Expect(after.Data).NotTo(HaveKey("k-intruder"))
	})

	It("rotates under traffic: no grant under a retired key or a revoked epoch is accepted, holders continue above the highest fence", func() {
		ns := newNamespace()
		oldKey, oldSeed := signingKey()
		oldSigner, err := grant.NewSigner(oldKey, oldSeed)
		Expect(err).NotTo(HaveOccurred())
		Expect(primary.issuer.SigningKeyID()).To(Equal(oldKey))
		oldEpoch := primary.issuer.Epoch()

		// A holder across the whole rotation, under the old key and epoch.
		pinned := newTarget(protectedKinds[0], ns, "pinned", locksv1.EnforcementEnforce, func(fr *locksv1.FencedResource) { fr.Spec.LeaseDurationSeconds = 600 })
		g0 := held(ns, "pinned", "worker-e", "g0")
		Expect(pinned.write(g0, 1, "before")).To(Succeed())
		Expect(g0.Status.Grant.IssuerEpoch).To(Equal(oldEpoch))

		// Traffic: holders acquire, write three segments and release, on three
		// resources, for as long as the rotation runs and a while after.
		tr := newRotationTraffic(ns, 3)
		tr.start()
		DeferCleanup(tr.stop) // also when the spec fails midway

		By("a dry run plans and changes nothing")
		dry := kubectlFence(adminCfg, "keys", "rotate", "--dry-run")
		Expect(dry.code).To(Equal(0), dry.stderr)
		Expect(dry.stdout).To(ContainSubstring("PLAN"))
		Expect(dry.stdout).To(ContainSubstring("Dry run: the request would be accepted; nothing was changed."))
		Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.KeyRotationConfigMap}, &corev1.ConfigMap{})).
			To(WithTransform(apierrors.IsNotFound, BeTrue()), "a dry run wrote the rotation request")
		Expect(primary.issuer.SigningKeyID()).To(Equal(oldKey))
		Eventually(tr.acceptedCount).Should(BeNumerically(">=", 3), "no traffic before the rotation")

		By("kubectl fence keys rotate")
		res := kubectlFence(adminCfg, "keys", "rotate")
		Expect(res.code).To(Equal(0), res.stderr)
		again := kubectlFence(adminCfg, "keys", "rotate")
		Expect(again.code).NotTo(Equal(0))
		Expect(again.stderr).To(ContainSubstring("already requested or in progress"))

		var steps []string
		Eventually(func() string {
			var cm corev1.ConfigMap
			Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.KeyRotationConfigMap}, &cm)).To(Succeed())
			if s := cm.Data["status.step"]; s != "" && (len(steps) == 0 || steps[len(steps)-1] != s) {
				steps = append(steps, s)
			}
			return cm.Data["status.phase"]
		}, 60*time.Second, 20*time.Millisecond).Should(Equal("Complete"))
		completeAt := time.Now()
		AddReportEntry("rotation steps observed", strings.Join(steps, " → "))
		Expect(stepOrder(steps)).To(BeTrue(), "steps out of order: %v", steps)

		newKey, newSeed := signingKey()
		newSigner, err := grant.NewSigner(newKey, newSeed)
		Expect(err).NotTo(HaveOccurred())
		Expect(newKey).NotTo(Equal(oldKey))
		Expect(primary.issuer.SigningKeyID()).To(Equal(newKey))
		newEpoch := primary.issuer.Epoch()
		Expect(newEpoch).To(BeNumerically(">", oldEpoch))
		bundle, err := grant.ParseTrustBundle(anchorConfigMap(locksv1.TrustBundleConfigMap).Data)
		Expect(err).NotTo(HaveOccurred())
		Expect(bundle.KeyIDs()).To(Equal([]string{newKey}))
		Expect(bundle.RevokedBelowEpoch).To(Equal(newEpoch))
		Expect(verifierReport()).To(Equal(map[string]string{
			locksv1.AnnotationVerifierKeys: newKey, locksv1.AnnotationVerifierRevokedBelow: fmt.Sprint(newEpoch)}))

		// Traffic goes on a little under the new key, then stops.
		Eventually(func() int { return tr.acceptedSince(completeAt) }, 20*time.Second).Should(BeNumerically(">=", 3))
		tr.stop()

		By("no grant under the retired key or a revoked epoch is accepted")
		waitPhase(g0, locksv1.PhaseRevoked)
		pinned.deniedWith(fence.ForgedGrant, func() error { return pinned.write(g0, 2, "old key, old epoch") })
		// The old epoch's grant, signed again by the new key, passes the signature: the epoch stops it.
		pinned.deniedWith(fence.RevokedEpoch, func() error {
			return pinned.write(g0, 2, "new key, old epoch", writeOpts{envelope: resign(newSigner)})
		})
		// The holder after the switch continues above the highest fence.
		g1 := held(ns, "pinned", "worker-a", "g1")
		Expect(g1.Status.Grant.FenceToken).To(BeNumerically(">", g0.Status.Grant.FenceToken))
		Expect(g1.Status.Grant.IssuerEpoch).To(Equal(newEpoch))
		Expect(strings.Split(g1.Status.Proof, ":")[1]).To(Equal(newKey))
		// Its own current grant, signed by the retired key, is forged now.
		pinned.deniedWith(fence.ForgedGrant, func() error {
			return pinned.write(g1, 1, "current grant, retired key", writeOpts{envelope: resign(oldSigner)})
		})
		Expect(pinned.write(g1, 1, "after")).To(Succeed())
		Expect(pinned.content()).To(Equal("after"))

		By("the traffic across the switch")
		tr.check(oldKey, newKey, newEpoch, completeAt)

		By("kubectl fence keys status shows the finished rotation")
		var view struct {
			TrustedKeys       []string `json:"trustedKeys"`
			RevokedBelowEpoch int64    `json:"revokedBelowEpoch"`
			Rotation          struct {
				Phase        string `json:"phase"`
				SigningKeyID string `json:"signingKeyID"`
			} `json:"rotation"`
			Steps []struct {
				Name, State string
			} `json:"steps"`
			Verifiers []struct {
				Replica string   `json:"replica"`
				Keys    []string `json:"keys"`
				Live    bool     `json:"live"`
			} `json:"verifiers"`
		}
		kubectlFence(adminCfg, "keys", "status", "-o", "json").json(&view)
		Expect(view.TrustedKeys).To(Equal([]string{newKey}))
		Expect(view.RevokedBelowEpoch).To(Equal(newEpoch))
		Expect(view.Rotation.Phase).To(Equal("Complete"))
		Expect(view.Rotation.SigningKeyID).To(Equal(newKey))
		Expect(view.Steps).To(HaveLen(5))
		for _, s := range view.Steps {
			Expect(s.State).To(Equal("done"), "step %s", s.Name)
		}
		Expect(view.Verifiers).To(ContainElement(And(
			HaveField("Replica", webhooks.ReplicaName()), HaveField("Keys", []string{newKey}), HaveField("Live", true))))
	})
})

// rotationStepOrder is the operator's step order (locksv1.RotationStep).
var rotationStepOrder = []string{"Idle", "StageNewKey", "AddKeyToBundle", "AwaitVerifiersTrustNewKey", "SwitchSignerAndBumpEpoch",
	"RevokeOldEpochs", "AwaitVerifiersRevoked", "RetireOldKey", "AwaitVerifiersDropOldKey", "Finish"}

// stepOrder reports whether the observed steps go forward only (the final
// Idle is the finished rotation).
func stepOrder(steps []string) bool {
	last := -1
	for i, s := range steps {
		idx := -1
		for j, o := range rotationStepOrder {
			if o == s {
				idx = j
			}
		}
		if idx < 0 || (idx < last && !(s == "Idle" && i == len(steps)-1)) {
			return false
		}
		last = idx
	}
	return true
}

func randomPublicKey() string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	return base64.StdEncoding.EncodeToString(pub)
}

// signingKey reads the issuer's active key from its Secret (as cluster-admin).
func signingKey() (string, []byte) {
	GinkgoHelper()
	var sec corev1.Secret
	Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: locksv1.SigningKeySecret}, &sec)).To(Succeed())
	return string(sec.Data["keyID"]), sec.Data["ed25519.seed"]
}

// resign replaces the envelope's proof with s's signature over the same grant.
func resign(s *grant.Signer) func(*fence.Envelope) {
	return func(env *fence.Envelope) {
		_, proof, err := s.Sign(env.Grant)
		Expect(err).NotTo(HaveOccurred())
		env.Proof = proof
	}
}

// verifierReport is what the suite's webhook replica reports it verifies with.
func verifierReport() map[string]string {
	GinkgoHelper()
	var l coordinationv1.Lease
	Expect(admin.Get(suiteCtx, client.ObjectKey{Namespace: opNamespace, Name: webhooks.VerifierLeaseName(webhooks.ReplicaName())}, &l)).To(Succeed())
	return map[string]string{
		locksv1.AnnotationVerifierKeys:         l.Annotations[locksv1.AnnotationVerifierKeys],
		locksv1.AnnotationVerifierRevokedBelow: l.Annotations[locksv1.AnnotationVerifierRevokedBelow],
	}
}

// acceptedWrite is one protected write the webhook accepted.
type acceptedWrite struct {
	resource      string
	fence, epoch  int64
	segment       int64
	keyID         string
	started, done time.Time
}

// rotationTraffic is holders acquiring, writing and releasing protected
// ConfigMaps, one sequential holder after another per resource.
type rotationTraffic struct {
	ns      string
	targets []target
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu       sync.Mutex
	accepted []acceptedWrite
	denials  map[string]int
}

func newRotationTraffic(ns string, n int) *rotationTraffic {
	tr := &rotationTraffic{ns: ns, done: make(chan struct{}), denials: map[string]int{}}
	for i := 0; i < n; i++ {
		tr.targets = append(tr.targets, newTarget(protectedKinds[0], ns, fmt.Sprintf("traffic-%d", i), locksv1.EnforcementEnforce,
			func(fr *locksv1.FencedResource) { fr.Spec.LeaseDurationSeconds = 600 }))
	}
	return tr
}

func (tr *rotationTraffic) start() {
	for _, t := range tr.targets {
		tr.wg.Add(1)
		go func() {
			defer GinkgoRecover()
			defer tr.wg.Done()
			owners := []string{"worker-a", "worker-b", "worker-c", "worker-d"}
			for n := 0; ; n++ {
				select {
				case <-tr.done:
					return
				default:
				}
				tr.hold(t, owners[n%len(owners)], fmt.Sprintf("r%d", n))
			}
		}()
	}
}

// hold acquires t as owner, writes up to three segments and releases.
func (tr *rotationTraffic) hold(t target, owner, requestID string) {
	lg := request(t.ns, t.name, owner, requestID)
	var phase locksv1.LockGrantPhase
	Eventually(func() bool {
		lg = getGrant(lg.Namespace, lg.Name)
		phase = lg.Status.Phase
		return phase != "" && phase != locksv1.PhasePending
	}, 20*time.Second, 20*time.Millisecond).Should(BeTrue(), "LockGrant %s stayed pending", lg.Name)
	if phase == locksv1.PhaseHeld {
		for seg := int64(1); seg <= 3; seg++ {
			started := time.Now()
			err := t.write(lg, seg, fmt.Sprintf("%s-%d", requestID, seg))
			tr.record(t, lg, seg, started, err)
			if err != nil {
				break
			}
		}
	}
	// A revoked or expired grant may still be released; either way it ends.
	_ = update(workers[owner], &locksv1.LockGrant{ObjectMeta: lg.ObjectMeta}, func(g *locksv1.LockGrant) { g.Spec.Release = true })
}

func (tr *rotationTraffic) record(t target, lg *locksv1.LockGrant, seg int64, started time.Time, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if err != nil {
		msg := err.Error()
		code := "other: " + msg
		if i := strings.Index(msg, "denied the request: "); i >= 0 {
			code = strings.SplitN(msg[i+len("denied the request: "):], ":", 2)[0]
		}
		tr.denials[code]++
		return
	}
	g := lg.Status.Grant
	tr.accepted = append(tr.accepted, acceptedWrite{resource: t.name, fence: g.FenceToken, epoch: g.IssuerEpoch, segment: seg,
		keyID: strings.Split(lg.Status.Proof, ":")[1], started: started, done: time.Now()})
}

func (tr *rotationTraffic) acceptedCount() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.accepted)
}

func (tr *rotationTraffic) acceptedSince(t time.Time) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, w := range tr.accepted {
		if w.started.After(t) {
			n++
		}
	}
	return n
}

func (tr *rotationTraffic) stop() {
	tr.once.Do(func() { close(tr.done) })
	tr.wg.Wait()
}

// check asserts the traffic's invariants: per resource the accepted fences
// never go down and a new fence starts at segment 1; writes begun after the
// rotation finished are all under the new key and a non-revoked epoch; both
// keys carried accepted writes, so the traffic really crossed the switch.
func (tr *rotationTraffic) check(oldKey, newKey string, revokedBelow int64, completeAt time.Time) {
	GinkgoHelper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	AddReportEntry("rotation traffic", fmt.Sprintf("%d accepted writes, denials %v", len(tr.accepted), tr.denials))
	highest := map[string]int64{}
	byKey := map[string]int{}
	for _, w := range tr.accepted {
		byKey[w.keyID]++
		Expect(w.keyID).To(Or(Equal(oldKey), Equal(newKey)), "write accepted under unknown key: %+v", w)
		if h := highest[w.resource]; w.fence < h || (w.fence > h && w.segment != 1) {
			Fail(fmt.Sprintf("accepted write %+v after highest fence %d of %s", w, h, w.resource))
		}
		highest[w.resource] = w.fence
		if w.started.After(completeAt) {
			Expect(w.keyID).To(Equal(newKey), "a write begun after the rotation was accepted under the retired key: %+v", w)
			Expect(w.epoch).To(BeNumerically(">=", revokedBelow), "a write begun after the rotation was accepted under a revoked epoch: %+v", w)
		}
	}
	Expect(byKey[oldKey]).To(BeNumerically(">", 0), "no write under the old key: the traffic did not cross the switch")
	Expect(byKey[newKey]).To(BeNumerically(">", 0), "no write under the new key")
	for code := range tr.denials {
		Expect(code).To(BeElementOf(string(fence.RevokedEpoch), string(fence.NotHeld), string(fence.ForgedGrant)),
			"unexpected denial in the traffic: %s", code)
	}
}
